//! `ListValue` of `proto/oncekv.proto`, written by hand instead of generated
//! (`build.rs` maps the message here with `extern_path`) for one reason: its
//! decoder refuses a list with more items than any legal value can hold,
//! while it decodes. An empty item costs two bytes on the wire and 24 in
//! memory plus a step of prost's decode, so a client message at the 8 MiB
//! bound made of empty items was 4.2 M items, about 100 MB and 150 ms of one
//! runtime thread spent before the value's own bound refused it. A value's
//! size counts each item as its length plus 8 bytes
//! (`oncekv_core::list_element_size_bytes`), so no list above
//! [`LIST_ITEMS_MAX`] items fits the hard bound on `value_bytes_max`: one
//! above it is refused as undecodable input (`INVALID_ARGUMENT`, by the
//! codec) after at most that many items. The wire format is prost's for the
//! same message, byte for byte; this module owns that message only and must
//! not decide anything about what a list may hold beyond the hard bound.

use oncekv_core::bounds::VALUE_BYTES_MAX;
use oncekv_core::list_element_size_bytes;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// The most items a list may have on the wire: what the hard bound on a
/// value's size holds when every item is empty.
pub const LIST_ITEMS_MAX: usize = (VALUE_BYTES_MAX / list_element_size_bytes(&[])) as usize;

/// The field number of `items`.
const ITEMS: u32 = 1;

/// `message ListValue { repeated bytes items = 1; }`
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct ListValue {
    pub items: Vec<Vec<u8>>,
}

impl Message for ListValue {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encoding::bytes::encode_repeated(ITEMS, &self.items, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != ITEMS {
            return encoding::skip_field(wire_type, tag, buf, ctx);
        }
        if self.items.len() >= LIST_ITEMS_MAX {
            return Err(too_many_items());
        }
        encoding::bytes::merge_repeated(wire_type, &mut self.items, buf, ctx).map_err(
            |mut error| {
                error.push("ListValue", "items");
                error
            },
        )
    }

    fn encoded_len(&self) -> usize {
        encoding::bytes::encoded_len_repeated(ITEMS, &self.items)
    }

    fn clear(&mut self) {
        self.items.clear();
    }
}

/// prost 0.14 builds a described decode error only through this deprecated
/// constructor (it is what its own derived code reaches); the version is
/// pinned by the workspace, and a later prost that drops it fails to build
/// here rather than silently.
#[allow(deprecated)]
#[cold]
fn too_many_items() -> DecodeError {
    DecodeError::new(format!(
        "ListValue.items: more than {LIST_ITEMS_MAX} items, more than any value within the \
         hard bound of {VALUE_BYTES_MAX} bytes can hold"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What prost derives for the message: the reference encoding.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Derived {
        #[prost(bytes = "vec", repeated, tag = "1")]
        items: Vec<Vec<u8>>,
    }

    proptest! {
        /// Byte for byte prost's encoding, both ways, unknown fields skipped.
        #[test]
        fn encodes_and_decodes_as_prost_derives(
            items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..50),
            unknown in any::<u64>(),
        ) {
            let ours = ListValue { items: items.clone() };
            let derived = Derived { items };
            prop_assert_eq!(ours.encode_to_vec(), derived.encode_to_vec());
            prop_assert_eq!(ours.encoded_len(), derived.encoded_len());
            let mut bytes = derived.encode_to_vec();
            // An unknown varint field 2, as a newer peer might send.
            encoding::uint64::encode(2, &unknown, &mut bytes);
            prop_assert_eq!(ListValue::decode(bytes.as_slice()).unwrap(), ours);
        }
    }

    /// A list at the bound decodes; one item more is refused, naming the
    /// bound, after at most the bound's items.
    #[test]
    fn a_list_beyond_the_bound_is_refused() {
        assert_eq!(LIST_ITEMS_MAX, 524_288);
        let at = Derived {
            items: vec![Vec::new(); LIST_ITEMS_MAX],
        }
        .encode_to_vec();
        assert_eq!(
            ListValue::decode(at.as_slice()).unwrap().items.len(),
            LIST_ITEMS_MAX
        );
        let beyond = Derived {
            items: vec![Vec::new(); LIST_ITEMS_MAX + 1],
        }
        .encode_to_vec();
        let error = ListValue::decode(beyond.as_slice()).unwrap_err();
        assert!(
            error.to_string().contains("more than 524288 items"),
            "{error}"
        );
    }
}
