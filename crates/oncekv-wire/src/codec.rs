//! The gRPC codec of every oncekv service: prost's, except that a request
//! message that does not decode is the caller's malformed input —
//! `INVALID_ARGUMENT` with the `INVALID_ARGUMENT` reason (final), like any
//! other malformed input — instead of tonic's bare `INTERNAL`, which no
//! table of ours lists and which a client must read as "outcome unknown".
//! Only a server decodes requests, so this never touches a reply: a client
//! that cannot decode its reply still gets `INTERNAL` (the request may have
//! been executed). `RaftMessage` is both a request and a reply of the peer
//! service; either way a peer treats the refusal as a failed RPC. It owns
//! this mapping only and must not look into what a message means.

use crate::status::{ErrorReason, reason_status};
use prost::{Message, Name};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The first buffer each encoded message (each reply, on a server) gets;
/// a larger message grows it. tonic's default, 8 KiB, is 100 times a typical
/// reply and cost the leader page faults on fresh memory for every reply
/// (5% of its samples at 256 clients, docs/benchmarks.md).
const ENCODE_BUFFER_BYTES: usize = 512;
/// tonic's default: a stream's encoder yields after this many bytes.
const ENCODE_YIELD_BYTES: usize = 32 * 1024;

/// The codec named in `build.rs` (`codec_path`) for generated clients and
/// servers alike.
#[derive(Debug, Clone)]
pub struct WireCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        WireCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Name + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(
            ENCODE_BUFFER_BYTES,
            ENCODE_YIELD_BYTES,
        ))
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder {
            inner: self.inner.decoder(),
        }
    }
}

/// prost's decoder, with the refusal of an undecodable request mapped.
#[derive(Debug, Clone)]
pub struct WireDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Name + Default> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(decode_failure::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// What to answer when a `U` did not decode (prost's `INTERNAL` status).
pub fn decode_failure<U: Name>(status: Status) -> Status {
    let name = U::full_name();
    if is_request(&name) {
        reason_status(ErrorReason::InvalidArgument(format!(
            "malformed {name} message: {}",
            status.message()
        )))
    } else {
        status
    }
}

/// Whether the message named `full_name` is some method's request.
fn is_request(full_name: &str) -> bool {
    crate::proto::REQUEST_MESSAGES.contains(&full_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{self, Reason};
    use crate::status::error_detail;

    /// prost's refusal of an undecodable request becomes INVALID_ARGUMENT
    /// with our reason; of a reply it stays INTERNAL without one (the
    /// request may have been executed). The whole path, from bytes on the
    /// wire, is tested against a running node in `tests/limits.rs`.
    #[test]
    fn undecodable_requests_are_invalid_arguments() {
        let garbage = prost::Message::decode(&[0x12u8, 0x7f, 0x01][..])
            .map(|_: proto::ReadRequest| ())
            .unwrap_err();
        let prost_status = Status::internal(garbage.to_string());
        let error = decode_failure::<proto::ReadRequest>(prost_status.clone());
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        let detail = error_detail(&error).expect("our detail");
        assert_eq!(detail.reason(), Reason::InvalidArgument);
        assert!(error.message().contains("oncekv.v1.ReadRequest"), "{error}");

        let error = decode_failure::<proto::ReadReply>(prost_status);
        assert_eq!(error.code(), tonic::Code::Internal);
        assert!(error_detail(&error).is_none());
    }

    /// Every method's request is known as a request, and no reply of the
    /// client or admin service is.
    #[test]
    fn requests_and_replies_are_told_apart() {
        for request in [
            proto::RegisterRequest::full_name(),
            proto::ExecuteRequest::full_name(),
            proto::ExecutePlainRequest::full_name(),
            proto::SetConfigRequest::full_name(),
            proto::LocalReadRequest::full_name(),
            proto::RaftMessage::full_name(),
        ] {
            assert!(is_request(&request), "{request}");
        }
        for reply in [
            proto::ExecuteReply::full_name(),
            proto::SessionInfo::full_name(),
            proto::StatusReply::full_name(),
        ] {
            assert!(!is_request(&reply), "{reply}");
        }
    }
}
