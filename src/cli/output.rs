//! How the CLI's cluster commands (the key-value and admin ones) report:
//! a `Success` (plain lines, or the fields of one JSON object) or a
//! `Failure` (a kind, one line of what happened, one of what to do, and
//! whether the command may have taken effect), printed by `print_report`,
//! and the process exit codes. A client library error becomes a failure in
//! `Failure::from_client`: its name is the library's own
//! ([`oncekv_client::Error::kind`]) and its text the library's Display;
//! this module only adds the hint, the exit code and the JSON fields. It
//! must not talk to the cluster (but for `Failure::explained`, which asks
//! [`super::reach`] why a call did not get through) and decides no
//! command's result.
//!
//! # JSON
//!
//! With `--json` the result is one JSON object on one line of stdout, with
//! `"ok"` telling success from failure: `{"ok":true,…}` with the command's
//! fields, or `{"ok":false,"error":"…","kind":"unavailable","outcome":"none"}`
//! on a failure: `kind` names the error — a refusal or a client library
//! error by the library's own name ([`Error::kind`]: `unavailable`,
//! `outcome_unknown`, `session_expired`, `wrong_cluster`, `seq_conflict`,
//! `response_discarded`, `invalid_argument`, `unauthenticated`,
//! `permission_denied`, `resource_exhausted`, `limit_exceeded`,
//! `key_conflict`, `fenced`, `in_progress`), else what the CLI found
//! itself (`not_found`, `overflow`, `wrong_type`; `admin hash`'s
//! `hash_mismatch`, `incomplete`, `undecided`; `once`'s `cannot_run`,
//! `undecodable`) — and `outcome` is `"none"` (the
//! command had no effect) or `"unknown"` (it may have had one; then `"seq"`
//! and `"fenced"` are given too). `"hint"` says what to do, when there is
//! advice; an `unavailable` failure also has `"nodes"`: what each endpoint
//! said when asked why (`{"endpoint","reachable":false,"error":"connection
//! refused"}`, or `{"endpoint","reachable":true,"node_id","role",
//! "leader_id"}`).
//!
//! The error is also written to stderr, in both modes: `error: ` and one
//! line of what happened, then `hint: ` and one line of what to do. A call
//! that did not get through is explained by asking every endpoint once
//! ([`super::reach`]): nothing listening, no answer, unknown host, no
//! leader, not initialised, or a leader that answered too slowly. The
//! client library's own words are logged at debug level (`RUST_LOG=debug`).
//!
//! # Exit codes
//!
//! - 0: success (a `cas` that did not swap, and a `del` of an absent key,
//!   are successes: the command ran and the answer is definite).
//! - 1: definite failure, nothing was executed: invalid argument (an empty
//!   key included), a limit the request breaks (a key, value or list too
//!   large: `kind` `limit_exceeded`, with `limit`, `limit_max` and
//!   `limit_requested`), wrong cluster, seq conflict, response discarded,
//!   session expired on the first attempt, cluster unavailable before the
//!   command was sent (no node reachable, no leader, no session), an
//!   increment that would overflow or a value of the wrong type (nothing
//!   changed), the key absent for `get`; for `sessions`, no node answered.
//! - 2: usage error (clap's, or a VALUE that is not an i64 with `--int`);
//!   reported on stderr only, even with `--json`.
//! - 3: outcome unknown ([`Error::OutcomeUnknown`]): the command may or may
//!   not have taken effect — not answered in time, or a retry refused for
//!   good after an attempt that may have been applied (rule 22: an
//!   `unauthenticated` retry after a lost reply is no proof that nothing
//!   ran). When `fenced` is true the raised floor is
//!   committed, so no late copy can execute; either way the session is then
//!   closed (best effort), which also stops late copies. With
//!   `--idempotency-key` ([`Error::KeyOutcomeUnknown`]): running the same
//!   command with the same key again learns the outcome. An at-least-once
//!   call ([`Error::PlainOutcomeUnknown`]) may even apply later.
//! - 4: key conflict ([`Error::KeyConflict`], kind `key_conflict`): the
//!   `--idempotency-key` was used before (by this principal, within its TTL)
//!   with another command. Nothing executed, like exit 1, but final in a
//!   stronger sense: the same command with the same key can never succeed.
//!
//! `once` passes its command's exit code through (a run now, or a replay)
//! and gives 1–4 for its own failures in the senses above, plus 5
//! ([`EXIT_FENCED`]), 75 ([`EXIT_IN_PROGRESS`]), 126 and 127 (the command
//! cannot be run, not found): [`ONCE_EXIT_CODES_HELP`].

use std::io::Write;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};

use oncekv_client::Error;

use super::reach::{self, plain_reason};

/// Exit code of a success.
pub const EXIT_OK: i32 = 0;
/// Exit code of a definite failure: nothing was executed.
pub const EXIT_FAILED: i32 = 1;
/// Exit code of a usage error (as clap's).
pub const EXIT_USAGE: i32 = 2;
/// Exit code of an unknown outcome: the command may have been executed.
pub const EXIT_UNKNOWN: i32 = 3;
/// Exit code of KEY_CONFLICT: the `--idempotency-key` was used before with
/// another command. A definite failure (nothing executed) like exit 1, but
/// its own code: running the same command again can never succeed — the
/// key keeps answering its first command — so a script must not retry it.
pub const EXIT_KEY_CONFLICT: i32 = 4;
/// Exit code of `once` when the command ran but another holder took the
/// key over (its lease ran out): FENCED, the run's result not recorded.
pub const EXIT_FENCED: i32 = 5;
/// Exit code of `once` when another holder was still running the command
/// at `--timeout-ms` (sysexits' EX_TEMPFAIL: try again later); nothing ran.
pub const EXIT_IN_PROGRESS: i32 = 75;
/// Exit code of `once` when the command exists but cannot be run (as
/// shells give it).
pub const EXIT_CANNOT_RUN: i32 = 126;
/// Exit code of `once` when the command is not found (as shells give it).
pub const EXIT_NOT_FOUND: i32 = 127;

/// The exit codes, for `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes of put, get, del, incr, append, cas and sessions:
  0  success (also a cas that did not swap, a del of an absent key)
  1  definite failure, nothing executed: invalid argument (an empty key too),
     a limit the request breaks (key, value or list too large), wrong cluster,
     seq conflict, response discarded, session expired, cluster unavailable
     before the command was sent, overflow or wrong type, key absent (get), no
     node answered (sessions)
  2  usage error
  3  outcome unknown: the command may or may not have taken effect (the error
     says whether its seq is fenced; the session is closed either way); with
     --idempotency-key, run it again with the same key to learn the outcome
  4  key conflict: the --idempotency-key was used before with another command;
     nothing executed (the key keeps answering its first command)

With --json the result is one JSON object on stdout: {\"ok\":true,...} or
{\"ok\":false,\"error\":...,\"kind\":...,\"outcome\":\"none\"|\"unknown\"}.";

/// The exit codes of `once`, for its `--help`.
pub const ONCE_EXIT_CODES_HELP: &str = "\
Exit codes of once (the command's own code passes through):
  N    the command's exit code, when it ran now or its recorded result was
       replayed (128+S when a signal S killed it)
  1    nothing ran: the cluster could not be reached, a bad argument or
       credentials, a limit (key too long), or the claim's outcome unknown
  2    usage error
  3    the command ran, but whether its result was recorded is unknown: run
       the same once again to learn (it replays, or reruns after the lease)
  4    key conflict: KEY was claimed for another command (fingerprint);
       nothing ran
  5    fenced: another holder took KEY over while the command ran (its lease
       ran out); the command was stopped or its result not recorded
  75   in progress: another holder was still running it at --timeout-ms;
       nothing ran here (try again later)
  126  the command cannot be run; 127: not found (nothing claimed)

With --json the result is one JSON object on stdout: {\"ok\":true,\"exit_code\":...,
\"stdout\":...,\"replayed\":...} or {\"ok\":false,\"kind\":...,...}.";

/// What a command prints when it succeeds: plain lines, or the fields of
/// the JSON object (besides `"ok":true`).
#[derive(Debug, Default)]
pub(super) struct Success {
    pub(super) lines: Vec<String>,
    pub(super) fields: Map<String, Json>,
    /// Plain mode only: lines for people on stderr (a keyed command's
    /// replay), keeping stdout the same as the first answer's.
    pub(super) notes: Vec<String>,
}

/// A success of `lines` (plain) and `fields` (JSON).
pub(super) fn success<const N: usize>(lines: Vec<String>, fields: [(&str, Json); N]) -> Success {
    Success {
        lines,
        fields: fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        notes: Vec::new(),
    }
}

/// Why a command failed, and how to report it.
#[derive(Debug)]
pub(super) struct Failure {
    exit: i32,
    kind: &'static str,
    /// What happened, on one line.
    message: String,
    /// What to do about it, on one line (printed as a second line).
    hint: Option<String>,
    /// The command may or may not have taken effect (JSON `"outcome":
    /// "unknown"`); when false it certainly had none (`"none"`).
    may_have_taken_effect: bool,
    /// Extra JSON fields (the key, the seq of an unknown outcome, …).
    fields: Map<String, Json>,
}

impl Failure {
    pub(super) fn new(kind: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            exit: EXIT_FAILED,
            kind,
            message: message.into(),
            hint: None,
            may_have_taken_effect: false,
            fields: Map::new(),
        }
    }

    /// The failure's name (the JSON `kind`).
    pub(super) fn kind(&self) -> &'static str {
        self.kind
    }

    /// What happened, on one line.
    pub(super) fn message(&self) -> &str {
        &self.message
    }

    /// The process exit code it gives.
    #[cfg(test)]
    pub(super) fn exit(&self) -> i32 {
        self.exit
    }

    /// The same failure, with what to do about it.
    pub(super) fn hint(self, hint: impl Into<String>) -> Failure {
        Failure {
            hint: Some(hint.into()),
            ..self
        }
    }

    /// A failure to get through to the cluster, explained by `diagnosis`
    /// (what the endpoints said when asked): kind `unavailable`, nothing
    /// executed (exit 1).
    pub(super) fn unreachable(diagnosis: reach::Diagnosis) -> Failure {
        Failure::new("unavailable", diagnosis.message)
            .hint(diagnosis.hint)
            .with("nodes", Json::Array(diagnosis.nodes))
    }

    /// This failure (a call that did not get through to `endpoints`),
    /// explained by asking them once why not, its own text kept as the
    /// detail; its other JSON fields are kept.
    pub(super) async fn explained(self, endpoints: &[String], timeout: Duration) -> Failure {
        tracing::debug!(error = %self.message, ?endpoints, "the call did not get through");
        let probes = reach::probe(endpoints, timeout).await;
        let mut explained = Failure::unreachable(reach::diagnose(&probes, Some(&self.message)));
        for (name, value) in self.fields {
            explained.fields.entry(name).or_insert(value);
        }
        explained
    }

    /// Prints the failure on stderr (no JSON) and returns its exit code.
    pub(super) fn print_to_stderr(self) -> i32 {
        let stderr = std::io::stderr();
        print_report(&mut std::io::sink(), &mut stderr.lock(), false, Err(self))
    }

    pub(super) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            exit: EXIT_USAGE,
            ..Failure::new("usage", message)
        }
    }

    /// The same failure, but one that may have taken effect (exit 3).
    pub(super) fn unknown(self) -> Failure {
        Failure {
            exit: EXIT_UNKNOWN,
            may_have_taken_effect: true,
            ..self
        }
    }

    /// The same failure, exiting with `exit`.
    pub(super) fn with_exit(self, exit: i32) -> Failure {
        Failure { exit, ..self }
    }

    /// The same failure, after something ran that may have had an effect
    /// (JSON `"outcome":"unknown"`), keeping its exit code.
    pub(super) fn may_have_taken_effect(self) -> Failure {
        Failure {
            may_have_taken_effect: true,
            ..self
        }
    }

    pub(super) fn with(mut self, field: &str, value: Json) -> Failure {
        self.fields.insert(field.to_owned(), value);
        self
    }

    /// The same failure with `fields` too (replacing any of the same name).
    pub(super) fn with_fields(mut self, fields: Map<String, Json>) -> Failure {
        self.fields.extend(fields);
        self
    }

    /// The failure of a client call on `key`: the library's error by its
    /// own name ([`Error::kind`]) and words, with what to do and the exit
    /// code. An `unavailable` one is then [`Failure::explained`] by the
    /// caller.
    pub(super) fn from_client(error: &Error, key: &str) -> Failure {
        tracing::debug!(error = ?error, key, "the client call failed");
        let failure =
            Failure::new(error.kind(), plain_reason(&error.to_string())).with("key", json!(key));
        match error {
            Error::LimitExceeded {
                limit,
                max,
                requested,
            } => failure
                .hint(format!(
                    "nothing was executed: the command itself breaks {limit} ({max}); make it \
                     smaller, or an operator raises the limit (`oncekv admin config set`)"
                ))
                .with("limit", json!(limit.to_string()))
                .with("limit_max", json!(max))
                .with("limit_requested", json!(requested)),
            Error::OutcomeUnknown {
                seq,
                fenced,
                reason,
            } => {
                let fence = if *fenced {
                    "its seq is fenced, so no late copy of it can execute"
                } else {
                    "the fence was not confirmed; the session is closed (best effort), which \
                     also stops late copies"
                };
                Failure {
                    message: format!(
                        "outcome unknown for seq {seq} ({}): the command may or may not have \
                         taken effect",
                        plain_reason(reason)
                    ),
                    ..failure
                }
                .unknown()
                .hint(format!(
                    "{fence}; read the key (`oncekv get {key}`) before running the command again"
                ))
                .with("seq", json!(seq))
                .with("fenced", json!(fenced))
            }
            Error::SessionExpired => failure
                .hint("nothing was executed; run the command again (it registers a new session)"),
            Error::ResourceExhausted(_) => failure.hint(
                "nothing was executed: a capacity limit of the cluster is reached; try again \
                 later, or an operator raises it (`oncekv admin config`)",
            ),
            Error::InvalidArgument(_) => {
                failure.hint("nothing was executed: fix the command (`oncekv --help`)")
            }
            Error::KeyOutcomeUnknown { .. } => failure.unknown().hint(
                "run the same command with the same idempotency key again to learn its outcome",
            ),
            Error::PlainOutcomeUnknown { .. } => failure.unknown().hint(format!(
                "read the key (`oncekv get {key}`) before running the command again"
            )),
            Error::KeyConflict { .. } => Failure {
                exit: EXIT_KEY_CONFLICT,
                ..failure
            }
            .hint(
                "the key keeps answering the command it first ran (until its TTL): use a new \
                 idempotency key for new work",
            ),
            Error::Fenced { current_fence } => Failure {
                exit: EXIT_FENCED,
                ..failure
            }
            .with("current_fence", json!(current_fence))
            .hint(
                "another holder owns the effect now: stop; nothing of this holder's was recorded",
            ),
            Error::ClaimInProgress { retry_after_ms } => Failure {
                exit: EXIT_IN_PROGRESS,
                ..failure
            }
            .with("retry_after_ms", json!(retry_after_ms))
            .hint(format!(
                "another holder is running it; try again later (its lease runs out within \
                 {retry_after_ms} ms unless it is renewed)"
            )),
            _ => failure,
        }
    }
}

/// Prints a command's result and returns its exit code. A success goes to
/// `out` (plain lines, or one JSON object); a failure goes to `err`, and with
/// `json` (unless it is a usage error) also as one JSON object to `out`.
pub(super) fn print_report(
    out: &mut impl Write,
    err: &mut impl Write,
    json: bool,
    report: Result<Success, Failure>,
) -> i32 {
    // A broken stdout (say, a closed pipe) cannot be reported anywhere
    // better than stderr; the exit code still tells the command's fate.
    let printed = match &report {
        Ok(success) => {
            if json {
                let mut object = Map::new();
                object.insert("ok".to_owned(), Json::Bool(true));
                object.extend(success.fields.clone());
                writeln!(out, "{}", Json::Object(object))
            } else {
                for note in &success.notes {
                    let _ = writeln!(err, "{note}");
                }
                success
                    .lines
                    .iter()
                    .try_for_each(|line| writeln!(out, "{line}"))
            }
        }
        Err(failure) => {
            let _ = writeln!(err, "error: {}", failure.message);
            if let Some(hint) = &failure.hint {
                let _ = writeln!(err, "hint: {hint}");
            }
            if json && failure.exit != EXIT_USAGE {
                writeln!(out, "{}", failure_json(failure))
            } else {
                Ok(())
            }
        }
    };
    if let Err(error) = printed.and_then(|()| out.flush()) {
        let _ = writeln!(err, "error: cannot write the result: {error}");
    }
    let _ = err.flush();
    match report {
        Ok(_) => EXIT_OK,
        Err(failure) => failure.exit,
    }
}

/// `{"ok":false,"error","hint"?,"kind","outcome",…fields}`.
fn failure_json(failure: &Failure) -> Json {
    let mut object = Map::new();
    object.insert("ok".to_owned(), Json::Bool(false));
    object.insert("error".to_owned(), json!(failure.message));
    if let Some(hint) = &failure.hint {
        object.insert("hint".to_owned(), json!(hint));
    }
    object.insert("kind".to_owned(), json!(failure.kind));
    let outcome = if failure.may_have_taken_effect {
        "unknown"
    } else {
        "none"
    };
    object.insert("outcome".to_owned(), json!(outcome));
    object.extend(failure.fields.clone());
    Json::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each client error maps to its exit code; only an unknown outcome is 3.
    #[test]
    fn client_errors_map_to_exit_codes() {
        let definite = [
            Error::Unavailable("x".into()),
            Error::SessionExpired,
            Error::WrongCluster {
                expected: "ab".into(),
            },
            Error::SeqConflict { seq: 1 },
            Error::ResponseDiscarded { seq: 1, floor: 2 },
            Error::InvalidArgument("x".into()),
            Error::Unauthenticated("x".into()),
            Error::PermissionDenied("x".into()),
            Error::ResourceExhausted("x".into()),
            Error::LimitExceeded {
                limit: oncekv_core::Limit::ValueBytes,
                max: 65_536,
                requested: 65_537,
            },
        ];
        for error in definite {
            let failure = Failure::from_client(&error, "k");
            assert_eq!(failure.exit, EXIT_FAILED, "{error:?}");
            assert_eq!(failure_json(&failure)["outcome"], "none");
        }
        let unknown = Failure::from_client(
            &Error::OutcomeUnknown {
                seq: 4,
                reason: "deadline".into(),
                fenced: true,
            },
            "k",
        );
        assert_eq!(unknown.exit, EXIT_UNKNOWN);
        let object = failure_json(&unknown);
        assert_eq!(object["ok"], false);
        assert_eq!(object["outcome"], "unknown");
        assert_eq!(object["kind"], "outcome_unknown");
        assert_eq!(object["seq"], 4);
        assert_eq!(object["fenced"], true);
        assert_eq!(object["key"], "k");

        let conflict = Failure::from_client(&Error::KeyConflict { key: "ik".into() }, "k");
        assert_eq!(conflict.exit, EXIT_KEY_CONFLICT);
        let object = failure_json(&conflict);
        assert_eq!(object["kind"], "key_conflict");
        assert_eq!(object["outcome"], "none");
        let lost = Failure::from_client(
            &Error::KeyOutcomeUnknown {
                key: "ik".into(),
                reason: "deadline".into(),
            },
            "k",
        );
        assert_eq!(lost.exit, EXIT_UNKNOWN);
        assert_eq!(failure_json(&lost)["outcome"], "unknown");

        // Claims: a stale holder, and a holder still running at the wait's end.
        let fenced = Failure::from_client(&Error::Fenced { current_fence: 9 }, "k");
        assert_eq!(fenced.exit, EXIT_FENCED);
        assert_eq!(failure_json(&fenced)["kind"], "fenced");
        assert_eq!(failure_json(&fenced)["current_fence"], 9);
        let waiting = Failure::from_client(
            &Error::ClaimInProgress {
                retry_after_ms: 700,
            },
            "k",
        );
        assert_eq!(waiting.exit, EXIT_IN_PROGRESS);
        assert_eq!(failure_json(&waiting)["kind"], "in_progress");
        assert_eq!(failure_json(&waiting)["outcome"], "none");
    }

    /// A success prints plain lines or one JSON object; a failure goes to
    /// stderr, and with --json also to stdout, except usage errors.
    #[test]
    fn reports_print_to_the_right_stream() {
        let print = |json: bool, report: Result<Success, Failure>| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = print_report(&mut out, &mut err, json, report);
            (
                code,
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
            )
        };
        let ok = || success(vec!["a".into(), "b".into()], [("key", json!("k"))]);
        assert_eq!(print(false, Ok(ok())), (0, "a\nb\n".into(), String::new()));
        assert_eq!(
            print(true, Ok(ok())),
            (0, "{\"key\":\"k\",\"ok\":true}\n".into(), String::new())
        );
        let absent = || Failure::new("not_found", "key not found").with("value", Json::Null);
        assert_eq!(
            print(false, Err(absent())),
            (1, String::new(), "error: key not found\n".into())
        );
        let (code, out, err) = print(true, Err(absent()));
        assert_eq!((code, err.as_str()), (1, "error: key not found\n"));
        let object: Json = serde_json::from_str(&out).unwrap();
        assert_eq!(object["ok"], false);
        assert_eq!(object["value"], Json::Null);
        let (code, out, _) = print(true, Err(Failure::usage("bad")));
        assert_eq!((code, out.as_str()), (EXIT_USAGE, ""));
    }
}
