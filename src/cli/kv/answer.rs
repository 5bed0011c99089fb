//! What an executed key-value command prints: the registry's result as a
//! [`Success`] (plain line, JSON fields), an application refusal (an
//! overflow, a wrong type: nothing changed) as a [`Failure`], and a keyed
//! command's answer with its `duplicate` and `log_index` and, for a replay,
//! a note on stderr. Pure presentation of an answer already had; it must
//! not call the cluster.

use serde_json::{Map, Value as Json, json};

use oncekv_client::KeyedReply;
use oncekv_core::{Command, CommandResult};

use crate::cli::output::{Failure, Success, success};
use crate::cli::values::{kind_name, value_inline, value_json};

/// What an executed `command` on `key` prints, from its `result`; an
/// application refusal (an overflow, a wrong type) is a failure.
pub(super) fn command_success(
    key: &str,
    command: &Command,
    result: CommandResult,
) -> Result<Success, Failure> {
    match (command, result) {
        (Command::Put { value, .. }, CommandResult::Stored) => Ok(success(
            vec!["OK".to_owned()],
            [("key", json!(key)), ("value", value_json(value))],
        )),
        (Command::Delete { .. }, CommandResult::Deleted { existed }) => {
            let line = if existed { "deleted" } else { "absent" };
            Ok(success(
                vec![line.to_owned()],
                [("key", json!(key)), ("existed", json!(existed))],
            ))
        }
        (Command::Increment { .. }, CommandResult::Incremented { value }) => Ok(success(
            vec![value.to_string()],
            [("key", json!(key)), ("value", json!(value))],
        )),
        (Command::Append { .. }, CommandResult::Appended { length }) => Ok(success(
            vec![length.to_string()],
            [("key", json!(key)), ("length", json!(length))],
        )),
        (Command::CompareAndSwap { .. }, CommandResult::CompareAndSwap { swapped, current }) => {
            let verdict = if swapped { "swapped" } else { "not swapped" };
            Ok(success(
                vec![format!("{verdict} {}", value_inline(current.as_ref()))],
                [
                    ("key", json!(key)),
                    ("swapped", json!(swapped)),
                    ("current", current.as_ref().map_or(Json::Null, value_json)),
                ],
            ))
        }
        (_, other) => Err(application_failure(key, other)),
    }
}

/// An executed command whose application result is a refusal (nothing
/// changed): an overflow or a wrong type.
fn application_failure(key: &str, result: CommandResult) -> Failure {
    let failure = match result {
        CommandResult::Overflow { current } => Failure::new(
            "overflow",
            format!("the increment would overflow the value {current}; nothing changed"),
        )
        .hint("a value is a 64-bit signed integer: increment by less, or reset it with `put --int`")
        .with("current", json!(current)),
        CommandResult::WrongType { actual } => Failure::new(
            "wrong_type",
            format!(
                "the value at {key:?} is {}; nothing changed",
                kind_name(actual)
            ),
        )
        .hint(format!(
            "use a command for {} values (`oncekv get {key}` shows it), or another key",
            kind_name(actual)
        ))
        .with("actual", json!(kind_name(actual))),
        other => Failure::new(
            "invalid_argument",
            format!("unexpected result from the cluster: {other:?}"),
        ),
    };
    failure.with("key", json!(key))
}

/// What a `command` on `key` run with `idempotency_key` prints from the
/// key's `reply`: the command's answer (or its application refusal) with
/// the key's fields; a replay (nothing executed now) says so on stderr.
pub(super) fn keyed_success(
    key: &str,
    command: &Command,
    idempotency_key: &str,
    reply: KeyedReply,
) -> Result<Success, Failure> {
    let answer = reply_fields(&reply);
    let mut success = command_success(key, command, reply.result).map_err(|failure| {
        failure
            .with_fields(answer.clone())
            .with("idempotency_key", json!(idempotency_key))
    })?;
    success.fields.extend(answer);
    success
        .fields
        .insert("idempotency_key".to_owned(), json!(idempotency_key));
    if reply.duplicate {
        success.notes.push(format!(
            "replay: idempotency key {idempotency_key:?} had already executed this command; this \
             is its original answer (read at log index {}), nothing executed now",
            reply.log_index
        ));
    }
    Ok(success)
}

/// The JSON fields of a keyed answer: `duplicate` (a replay: nothing
/// executed now) and the answering entry's `log_index`.
fn reply_fields(reply: &KeyedReply) -> Map<String, Json> {
    let mut fields = Map::new();
    fields.insert("duplicate".to_owned(), json!(reply.duplicate));
    fields.insert("log_index".to_owned(), json!(reply.log_index));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::output::print_report;

    /// A keyed command's answer shows whether it was a replay: in JSON as
    /// `duplicate`, in plain mode as a note on stderr (stdout unchanged).
    #[test]
    fn replays_are_marked() {
        let command = Command::Increment {
            key: b"c".to_vec(),
            delta: 1,
        };
        let reply = KeyedReply {
            result: CommandResult::Incremented { value: 5 },
            duplicate: true,
            log_index: 9,
        };
        let mut replay = command_success("c", &command, reply.result.clone()).unwrap();
        replay.fields.extend(reply_fields(&reply));
        replay.notes.push("replay: …".into());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(print_report(&mut out, &mut err, false, Ok(replay)), 0);
        assert_eq!(String::from_utf8(out).unwrap(), "5\n");
        assert_eq!(String::from_utf8(err).unwrap(), "replay: …\n");
        let mut replay = command_success("c", &command, reply.result.clone()).unwrap();
        replay.fields.extend(reply_fields(&reply));
        replay.notes.push("replay: …".into());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_report(&mut out, &mut err, true, Ok(replay));
        let object: Json = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            object,
            json!({"ok": true, "key": "c", "value": 5, "duplicate": true, "log_index": 9})
        );
        assert!(err.is_empty(), "no note with --json");
        // An application refusal is still a failure, whatever the key.
        let refused = command_success("c", &command, CommandResult::Overflow { current: 1 });
        assert_eq!(refused.unwrap_err().kind(), "overflow");
    }
}
