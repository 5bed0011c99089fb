//! `oncekv once KEY [--lease-ms N] [--record-failures] [--fingerprint TEXT]
//! -- COMMAND [ARGS...]`: runs a command at most once across every machine
//! that asks (rule 20) — the cron job, migration or deploy step that must
//! never run twice. It claims KEY through the client library's
//! [`Client::once`]; runs the command (module `child`, under the guard of
//! module `guard`) with `ONCEKV_FENCE`, `ONCEKV_ATTEMPT` and
//! `ONCEKV_CLAIM_KEY` in its environment while the library's heartbeat
//! extends the lease; and records its exit code and stdout (module
//! `record`: the one encoding) when it exits 0 — or whatever it exits
//! with `--record-failures`; a non-zero exit otherwise releases the key,
//! so the next invocation runs the command again.
//!
//! A later invocation with the same KEY and command prints the recorded
//! stdout and exits with the recorded code, running nothing (a replay,
//! said on stderr); a concurrent one waits for the first, up to
//! `--timeout-ms` (default 10000; then exit 75); one that comes after a
//! holder died (SIGKILL, a crashed machine) waits out its lease and runs
//! the command again with `ONCEKV_ATTEMPT=2` and a larger `ONCEKV_FENCE`.
//! The fingerprint is the command line (the word `argv`, then each
//! argument after a NUL byte; a BLAKE3 hash of that when longer than the
//! wire's 16 KiB), or `--fingerprint TEXT`'s bytes: another command under
//! the same KEY is KEY_CONFLICT (exit 4).
//!
//! KEY is positional because the global `--key` is the TLS client key, and
//! the claim key reaches the command as `ONCEKV_CLAIM_KEY` because
//! `ONCEKV_KEY` is that TLS key's variable (a nested `oncekv` must not
//! misread it). Exit codes: [`ONCE_EXIT_CODES_HELP`]. It owns the
//! arguments, the fingerprint and the report; holding the key is the
//! library's, and deciding who holds it the cluster's.

mod child;
pub mod guard;
pub mod record;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Map, json};

use oncekv_client::{Client, ClientConfig, Error, OnceError, OnceOptions, OnceOutcome};
use oncekv_wire::convert::CLAIM_FINGERPRINT_BYTES_MAX;

use super::CommonArgs;
use super::common::TIMEOUT_MS_DEFAULT;
use super::output::{
    EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_FENCED, EXIT_KEY_CONFLICT, EXIT_NOT_FOUND, EXIT_OK,
    EXIT_UNKNOWN, Failure, Success, print_report,
};
use super::values::hex;
use child::Ran;
use record::{Record, STDOUT_MAX_BYTES};

/// `once`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct OnceArgs {
    /// The key naming the run (UTF-8): one command per key, run at most
    /// once (within the claim record's TTL, `claim_ttl_ms`). Also given as
    /// `--key KEY` when no KEY follows `once` (then a TLS client key comes
    /// from `ONCEKV_KEY` only).
    #[arg(value_name = "KEY", allow_hyphen_values = true)]
    pub key_arg: Option<String>,
    /// The key, resolved from KEY or `--key` after parsing
    /// ([`crate::cli::Cli::try_parse_checked`]).
    #[arg(skip)]
    pub key: String,
    /// The lease, renewed every third of it while the command runs: how
    /// long a holder that dies blocks the key before another may take over.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub lease_ms: u64,
    /// Record a non-zero exit too (its code and stdout are replayed, the
    /// command never runs again); by default a non-zero exit releases the
    /// key, and the next invocation runs the command again.
    #[arg(long)]
    pub record_failures: bool,
    /// What the key stands for, instead of the command line (so that two
    /// spellings of one job share a key, or a library caller's `once`
    /// with the same description; at most 16 KiB).
    #[arg(long, value_name = "TEXT")]
    pub fingerprint: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// How the effect ended without a result to record.
#[derive(Debug)]
enum NotRecorded {
    /// The command could not be started: nothing ran.
    Start(std::io::Error),
    /// It exited non-zero (without `--record-failures`).
    Failed(Record),
    /// Another holder took over while it ran: it was stopped.
    Fenced(Record),
}

/// What a finished `once` prints, and the exit code it gives.
struct Report {
    result: Result<Success, Failure>,
    /// The command's exit code, when `once` succeeded.
    exit: i32,
    /// Stdout to write as is after the report (a replay's recorded stdout).
    stdout: Vec<u8>,
}

impl OnceArgs {
    /// Runs `once`, prints its report, and returns the exit code.
    pub async fn run(&self, common: &CommonArgs) -> i32 {
        let report = match self.execute(common).await {
            Ok(report) => report,
            Err(failure) => Report {
                result: Err(failure),
                exit: EXIT_OK,
                stdout: Vec::new(),
            },
        };
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        let code = print_report(
            &mut stdout.lock(),
            &mut stderr.lock(),
            common.json,
            report.result,
        );
        if !report.stdout.is_empty() {
            let mut out = stdout.lock();
            if out
                .write_all(&report.stdout)
                .and_then(|()| out.flush())
                .is_err()
            {
                eprintln!("error: cannot write the recorded stdout");
            }
        }
        if code == EXIT_OK { report.exit } else { code }
    }

    async fn execute(&self, common: &CommonArgs) -> Result<Report, Failure> {
        let endpoints = common.endpoints()?;
        let credentials = common
            .credentials()
            .map_err(|error| Failure::usage(error.to_string()))?;
        find_program(&self.command)?;
        let client = Client::with_config(
            endpoints.clone(),
            ClientConfig {
                // Each call (a claim, an extend, the complete) has the
                // CLI's usual deadline; --timeout-ms is the wait for
                // another holder.
                call_timeout: Duration::from_millis(TIMEOUT_MS_DEFAULT),
                credentials,
                ..ClientConfig::default()
            },
        );
        let options = OnceOptions {
            lease: Duration::from_millis(self.lease_ms),
            wait: common.timeout(),
            heartbeat: None,
        };
        let live = !common.json;
        let holder: Mutex<Option<(u64, u64)>> = Mutex::new(None);
        let key = self.key.as_bytes();
        let outcome = client
            .once(key, &fingerprint(self), &options, |token| {
                let holder = &holder;
                async move {
                    if let Ok(mut holder) = holder.lock() {
                        *holder = Some((token.fence, token.attempt));
                    }
                    match child::run(&self.command, &token, live).await {
                        Err(error) => Err(NotRecorded::Start(error)),
                        Ok(Ran::Fenced(record)) => Err(NotRecorded::Fenced(record)),
                        Ok(Ran::Exited(record))
                            if record.exit_code == 0 || self.record_failures =>
                        {
                            Ok(record.encode())
                        }
                        Ok(Ran::Exited(record)) => Err(NotRecorded::Failed(record)),
                    }
                }
            })
            .await;
        let (fence, attempt) = holder.lock().ok().and_then(|held| *held).unwrap_or((0, 0));
        let report = match outcome {
            Ok(OnceOutcome::Ran { result, .. }) => {
                let record = Record::decode(&result).map_err(|error| {
                    Failure::new("undecodable", error.to_string()).may_have_taken_effect()
                })?;
                Ok(self.ran(&record, fence, attempt))
            }
            Ok(OnceOutcome::Replayed {
                result,
                fence,
                attempt,
                completed_ms,
            }) => self.replayed(&result, fence, attempt, completed_ms, live),
            Err(OnceError::Claim(error)) => Err(self.claim_failure(&error)),
            Err(OnceError::Failed { error, released }) => {
                self.not_recorded(error, released, fence, attempt)
            }
            Err(OnceError::Record { result, error }) => {
                self.record_failed(&client, &result, error, fence, attempt)
                    .await
            }
        };
        client.close().await;
        match report {
            Err(failure) if failure.kind() == "unavailable" => {
                Err(failure.explained(&endpoints, common.timeout()).await)
            }
            other => other,
        }
    }

    /// The command ran now and its result is recorded.
    fn ran(&self, record: &Record, fence: u64, attempt: u64) -> Report {
        let mut success = run_success(&self.key, record);
        success.fields.insert("replayed".into(), json!(false));
        success.fields.insert("fence".into(), json!(fence));
        success.fields.insert("attempt".into(), json!(attempt));
        if record.truncated {
            success.notes.push(format!(
                "note: stdout beyond {STDOUT_MAX_BYTES} bytes was not recorded: a replay prints \
                 only its beginning"
            ));
        }
        Report {
            result: Ok(success),
            exit: record.exit_code,
            stdout: Vec::new(),
        }
    }

    /// A replay: the recorded stdout and exit code; nothing ran.
    fn replayed(
        &self,
        result: &[u8],
        fence: u64,
        attempt: u64,
        completed_ms: u64,
        live: bool,
    ) -> Result<Report, Failure> {
        let record = Record::decode(result).map_err(|error| {
            Failure::new("undecodable", format!("{error}; nothing ran"))
                .hint(
                    "the key was completed by something other than `oncekv once` with this \
                     fingerprint: read it with `oncekv admin claims show`",
                )
                .with("key", json!(self.key))
                .with("result_hex", json!(hex(result)))
        })?;
        let mut success = run_success(&self.key, &record);
        success.fields.insert("replayed".into(), json!(true));
        success.fields.insert("fence".into(), json!(fence));
        success.fields.insert("attempt".into(), json!(attempt));
        success
            .fields
            .insert("completed_ms".into(), json!(completed_ms));
        success.notes.push(format!(
            "replay: {:?} already ran (attempt {attempt}, fence {fence}, exit {}); its recorded \
             output follows, nothing ran now",
            self.key, record.exit_code
        ));
        if record.truncated {
            success.notes.push(format!(
                "note: only the first {} bytes of its stdout were recorded",
                record.stdout.len()
            ));
        }
        Ok(Report {
            result: Ok(success),
            exit: record.exit_code,
            stdout: if live { record.stdout } else { Vec::new() },
        })
    }

    /// The key could not be claimed: nothing ran.
    fn claim_failure(&self, error: &Error) -> Failure {
        let failure = Failure::from_client(error, &self.key);
        match error {
            Error::KeyConflict { .. } => Failure::new(
                error.kind(),
                format!(
                    "{:?} was claimed for another command (another fingerprint); nothing ran",
                    self.key
                ),
            )
            .with_exit(EXIT_KEY_CONFLICT)
            .with("key", json!(self.key))
            .hint(
                "a key names one command: use a new key for new work, the same --fingerprint \
                 for another spelling of the same job, or `oncekv admin claims forget KEY`",
            ),
            Error::ClaimInProgress { retry_after_ms } => Failure::new(
                error.kind(),
                format!(
                    "{:?} is being run by another holder and did not finish within \
                     --timeout-ms; nothing ran here",
                    self.key
                ),
            )
            .with_exit(super::output::EXIT_IN_PROGRESS)
            .with("key", json!(self.key))
            .with("retry_after_ms", json!(retry_after_ms))
            .hint(format!(
                "try again later, or wait longer with --timeout-ms (the holder's lease runs out \
                 within {retry_after_ms} ms unless it is renewed)"
            )),
            Error::KeyOutcomeUnknown { reason, .. } => Failure::new(
                error.kind(),
                format!(
                    "could not learn whether {:?} was claimed ({reason}); the command did not run",
                    self.key
                ),
            )
            .with_exit(EXIT_FAILED)
            .with("key", json!(self.key))
            .hint(
                "run it again; if this claim was won, the key is held until its lease runs \
                 out, and the next run comes as attempt 2",
            ),
            _ => failure,
        }
    }

    /// The command did not leave a result to record: it failed (the key was
    /// released), could not start, or was stopped by a takeover.
    fn not_recorded(
        &self,
        error: NotRecorded,
        released: Result<(), Error>,
        fence: u64,
        attempt: u64,
    ) -> Result<Report, Failure> {
        let release_note = |success: &mut Success| match &released {
            Ok(()) => success.fields.insert("released".into(), json!(true)),
            Err(error) => {
                success.notes.push(format!(
                    "warning: the key could not be released ({error}): the next run waits out \
                     the lease ({} ms) and comes as attempt {}",
                    self.lease_ms,
                    attempt + 1
                ));
                success.fields.insert("released".into(), json!(false));
                success
                    .fields
                    .insert("release_error".into(), json!(error.to_string()))
            }
        };
        match error {
            NotRecorded::Failed(record) => {
                let mut success = run_success(&self.key, &record);
                success.fields.insert("replayed".into(), json!(false));
                success.fields.insert("recorded".into(), json!(false));
                success.fields.insert("fence".into(), json!(fence));
                success.fields.insert("attempt".into(), json!(attempt));
                success.notes.push(format!(
                    "oncekv once: the command exited {}: not recorded, the key is released (the \
                     next run runs it again; --record-failures would record it)",
                    record.exit_code
                ));
                release_note(&mut success);
                Ok(Report {
                    result: Ok(success),
                    exit: record.exit_code,
                    stdout: Vec::new(),
                })
            }
            NotRecorded::Start(error) => Err(Failure::new(
                "cannot_run",
                format!("cannot start the command: {error}; nothing ran"),
            )
            .with_exit(EXIT_CANNOT_RUN)
            .with("key", json!(self.key))
            .with("released", json!(released.is_ok()))),
            NotRecorded::Fenced(record) => Err(fenced_failure(
                &self.key,
                &record,
                "another holder took the key over while the command ran (its lease ran out \
                 unrenewed): the command was stopped and its result not recorded",
            )),
        }
    }

    /// The command ran, but its completion was refused or its outcome is
    /// unknown. A result the cluster's `claim_result_bytes_max` refuses is
    /// recorded again without its stdout.
    async fn record_failed(
        &self,
        client: &Client,
        result: &[u8],
        error: Error,
        fence: u64,
        attempt: u64,
    ) -> Result<Report, Failure> {
        let record = Record::decode(result).map_err(|error| {
            Failure::new("undecodable", error.to_string()).may_have_taken_effect()
        })?;
        let error = match error {
            Error::LimitExceeded { max, .. } => {
                let bare = record.without_stdout();
                match client
                    .complete_claim(self.key.as_bytes(), fence, &bare.encode())
                    .await
                {
                    Ok(_) => {
                        let mut report = self.ran(&record, fence, attempt);
                        if let Ok(success) = &mut report.result {
                            success.notes.push(format!(
                                "note: the cluster records at most {max} bytes of result \
                                 (claim_result_bytes_max): the exit code is recorded, stdout is not"
                            ));
                            success
                                .fields
                                .insert("stdout_recorded".into(), json!(false));
                        }
                        return Ok(report);
                    }
                    Err(error) => error,
                }
            }
            error => error,
        };
        Err(match error {
            Error::Fenced { current_fence } => fenced_failure(
                &self.key,
                &record,
                "the command finished, but another holder had taken the key over first (its \
                 lease ran out unrenewed): its result was not recorded",
            )
            .with("current_fence", json!(current_fence)),
            error => Failure::new(
                "outcome_unknown",
                format!(
                    "the command ran (exit {}), but recording its result failed: {error}",
                    record.exit_code
                ),
            )
            .with_exit(EXIT_UNKNOWN)
            .may_have_taken_effect()
            .with("key", json!(self.key))
            .with("exit_code", json!(record.exit_code))
            .hint(
                "run the same `oncekv once` again: it replays the result if it was recorded, \
                 else waits out this run's lease and runs the command again (attempt 2)",
            ),
        })
    }
}

/// The report of a run (now or replayed): `exit_code`, the stdout (in
/// JSON: text, or hex when not UTF-8) and whether it was cut.
fn run_success(key: &str, record: &Record) -> Success {
    let mut fields = Map::new();
    fields.insert("key".into(), json!(key));
    fields.insert("exit_code".into(), json!(record.exit_code));
    match std::str::from_utf8(&record.stdout) {
        Ok(text) => fields.insert("stdout".into(), json!(text)),
        Err(_) => fields.insert("stdout_hex".into(), json!(hex(&record.stdout))),
    };
    fields.insert("stdout_truncated".into(), json!(record.truncated));
    Success {
        lines: Vec::new(),
        fields,
        notes: Vec::new(),
    }
}

/// A run superseded by another holder (exit 5).
fn fenced_failure(key: &str, record: &Record, message: &str) -> Failure {
    Failure::new("fenced", message)
        .with_exit(EXIT_FENCED)
        .may_have_taken_effect()
        .with("key", json!(key))
        .with("exit_code", json!(record.exit_code))
        .hint(
            "the new holder owns the effect: run the same `oncekv once` again to see its \
             result; give a longer --lease-ms if the command is slow to renew",
        )
}

/// The claim's fingerprint: `--fingerprint`'s bytes, else the command
/// line — `argv`, then each argument after a NUL byte (no argument holds
/// one, so two command lines never share it); when that is longer than
/// the wire takes, `argv-blake3:` and its BLAKE3 hash in hex.
fn fingerprint(args: &OnceArgs) -> Vec<u8> {
    if let Some(text) = &args.fingerprint {
        return text.as_bytes().to_vec();
    }
    let mut bytes = b"argv".to_vec();
    for argument in &args.command {
        bytes.push(0);
        bytes.extend_from_slice(argument.as_bytes());
    }
    if bytes.len() as u64 > CLAIM_FINGERPRINT_BYTES_MAX {
        let hash = blake3::hash(&bytes);
        let mut short = b"argv-blake3:".to_vec();
        short.extend_from_slice(hash.to_hex().as_bytes());
        return short;
    }
    bytes
}

/// Whether the command can be started, before anything is claimed: a
/// program named with a `/` must be an executable file, another one must
/// be one in `PATH`. Not found is exit 127, not executable 126.
fn find_program(command: &[OsString]) -> Result<(), Failure> {
    let Some(program) = command.first() else {
        return Err(Failure::usage("no COMMAND after --"));
    };
    let executable = |path: &Path| {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            .ok()
    };
    let name = program.to_string_lossy();
    let found = if program.as_bytes().contains(&b'/') {
        executable(Path::new(program))
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut found = None;
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".").to_path_buf()
            } else {
                dir
            };
            match executable(&dir.join(OsStr::new(program))) {
                Some(true) => {
                    found = Some(true);
                    break;
                }
                Some(false) => found = found.or(Some(false)),
                None => {}
            }
        }
        found
    };
    match found {
        Some(true) => Ok(()),
        Some(false) => Err(Failure::new(
            "cannot_run",
            format!("{name}: not an executable file; nothing was claimed"),
        )
        .with_exit(EXIT_CANNOT_RUN)),
        None => Err(Failure::new(
            "not_found",
            format!("{name}: command not found; nothing was claimed"),
        )
        .with_exit(EXIT_NOT_FOUND)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<(OnceArgs, CommonArgs), clap::Error> {
        let args = ["oncekv", "once"].into_iter().chain(args.iter().copied());
        let cli = Cli::try_parse_checked(args)?;
        match cli.command {
            Command::Once(once) => Ok((once, cli.common)),
            other => panic!("not once: {other:?}"),
        }
    }

    /// KEY, the options and the common flags go before `--`; everything
    /// after it is the command, its own flags included; a command is
    /// required.
    #[test]
    fn arguments_parse() {
        let (once, common) = parse(&[
            "deploy-42",
            "--lease-ms",
            "2000",
            "--record-failures",
            "--json",
            "--timeout-ms",
            "500",
            "--",
            "sh",
            "-c",
            "echo --json",
        ])
        .unwrap();
        assert_eq!(once.key, "deploy-42");
        assert_eq!(once.lease_ms, 2000);
        assert!(once.record_failures);
        assert_eq!(once.command, ["sh", "-c", "echo --json"]);
        assert!(common.json);
        assert_eq!(common.timeout_ms, Some(500));
        let (once, _) = parse(&["k", "--", "true"]).unwrap();
        assert_eq!((once.lease_ms, once.record_failures), (30_000, false));
        for bad in [&["k"][..], &["k", "--"], &["--", "true"], &["k", "true"]] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
        // The global --key stays the TLS client key.
        let (once, common) = parse(&["k", "--key", "client-key.pem", "--", "true"]).unwrap();
        assert_eq!(once.key, "k");
        assert_eq!(common.key.as_deref(), Some(Path::new("client-key.pem")));
    }

    /// The fingerprint is the command line, unambiguously (arguments are
    /// NUL-separated), or --fingerprint's text; a long one is hashed.
    #[test]
    fn fingerprints_name_the_command() {
        let of = |args: &[&str]| {
            let mut all = vec!["k", "--"];
            all.extend_from_slice(args);
            fingerprint(&parse(&all).unwrap().0)
        };
        assert_eq!(of(&["sh", "-c", "echo a b"]), b"argv\0sh\0-c\0echo a b");
        assert_ne!(of(&["echo", "a b"]), of(&["echo", "a", "b"]));
        let (custom, _) = parse(&["k", "--fingerprint", "job 7", "--", "true"]).unwrap();
        assert_eq!(fingerprint(&custom), b"job 7");
        let long = "x".repeat(20_000);
        let hashed = of(&["echo", &long]);
        assert!(hashed.starts_with(b"argv-blake3:"));
        assert_eq!(hashed.len(), "argv-blake3:".len() + 64);
        assert_ne!(hashed, of(&["echo", &"y".repeat(20_000)]));
    }

    /// A command that cannot be found or run is refused before claiming.
    #[test]
    fn missing_programs_are_refused_before_claiming() {
        let command = |name: &str| vec![OsString::from(name)];
        assert!(find_program(&command("sh")).is_ok());
        assert!(find_program(&command("/bin/sh")).is_ok());
        let missing = find_program(&command("no-such-command-oncekv")).unwrap_err();
        assert_eq!(
            (missing.kind(), missing.exit()),
            ("not_found", EXIT_NOT_FOUND)
        );
        let missing = find_program(&command("./no/such/file")).unwrap_err();
        assert_eq!(missing.exit(), EXIT_NOT_FOUND);
        let directory = find_program(&command("/")).unwrap_err();
        assert_eq!(
            (directory.kind(), directory.exit()),
            ("cannot_run", EXIT_CANNOT_RUN)
        );
    }
}
