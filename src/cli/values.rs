//! How the CLI shows the registry's values and byte strings, plain and in
//! JSON: bytes as text when they are valid UTF-8, otherwise as hex (with a
//! `0x` prefix in plain text); ints in decimal; a list one item per line
//! (in a one-line form, comma-separated); an absent value as `(absent)`.
//! Pure formatting, shared by the key-value and admin commands: it must
//! not talk to the cluster nor decide how a command reports.

use serde_json::{Value as Json, json};

use oncekv_core::{Value, ValueKind};

/// Bytes as text when valid UTF-8, else `0x` and hex.
pub(super) fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("0x{}", hex(bytes)),
    }
}

/// The plain lines of a `get`: one, or one per list item (none for an
/// empty list).
pub(super) fn value_lines(value: &Value) -> Vec<String> {
    match value {
        Value::Bytes(bytes) => vec![bytes_text(bytes)],
        Value::Int(number) => vec![number.to_string()],
        Value::List(items) => items.iter().map(|item| bytes_text(item)).collect(),
    }
}

/// A value on one line (a `cas` result): list items comma-separated.
pub(super) fn value_inline(value: Option<&Value>) -> String {
    match value {
        None => "(absent)".to_owned(),
        Some(Value::List(items)) => items
            .iter()
            .map(|item| bytes_text(item))
            .collect::<Vec<_>>()
            .join(","),
        Some(value) => value_lines(value).concat(),
    }
}

/// `{"bytes":…}` / `{"bytes_hex":…}`, `{"int":…}`, `{"list":[…]}` /
/// `{"list_hex":[…]}` (hex when any item is not UTF-8).
pub(super) fn value_json(value: &Value) -> Json {
    match value {
        Value::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => json!({ "bytes": text }),
            Err(_) => json!({ "bytes_hex": hex(bytes) }),
        },
        Value::Int(number) => json!({ "int": number }),
        Value::List(items) => {
            let texts: Option<Vec<&str>> = items
                .iter()
                .map(|item| std::str::from_utf8(item).ok())
                .collect();
            match texts {
                Some(texts) => json!({ "list": texts }),
                None => {
                    json!({ "list_hex": items.iter().map(|item| hex(item)).collect::<Vec<_>>() })
                }
            }
        }
    }
}

/// Lowercase hex, no prefix.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A value's type, for a sentence: `bytes`, `an int`, `a list`.
pub(super) fn kind_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Bytes => "bytes",
        ValueKind::Int => "an int",
        ValueKind::List => "a list",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes print as text when UTF-8, else as 0x-hex; lists one item per
    /// line; the JSON form says which.
    #[test]
    fn values_print_as_text_or_hex() {
        assert_eq!(value_lines(&Value::Bytes(b"hello".to_vec())), ["hello"]);
        assert_eq!(value_lines(&Value::Bytes(vec![0xff, 0x00])), ["0xff00"]);
        assert_eq!(value_lines(&Value::Int(-7)), ["-7"]);
        let list = Value::List(vec![b"a".to_vec(), vec![0xfe]]);
        assert_eq!(value_lines(&list), ["a", "0xfe"]);
        assert_eq!(value_inline(Some(&list)), "a,0xfe");
        assert_eq!(value_inline(None), "(absent)");
        assert!(value_lines(&Value::List(Vec::new())).is_empty());

        assert_eq!(
            value_json(&Value::Bytes(b"hi".to_vec())),
            json!({"bytes": "hi"})
        );
        assert_eq!(
            value_json(&Value::Bytes(vec![0xff])),
            json!({"bytes_hex": "ff"})
        );
        assert_eq!(value_json(&Value::Int(5)), json!({"int": 5}));
        assert_eq!(
            value_json(&Value::List(vec![b"a".to_vec(), b"b".to_vec()])),
            json!({"list": ["a", "b"]})
        );
        assert_eq!(value_json(&list), json!({"list_hex": ["61", "fe"]}));
    }
}
