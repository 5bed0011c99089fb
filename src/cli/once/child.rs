//! One run of the command, from the runner's side (`oncekv once` holding
//! the claim): starts the guard ([`super::guard`]) with the claim in the
//! environment (`ONCEKV_FENCE`, `ONCEKV_ATTEMPT`, `ONCEKV_CLAIM_KEY`), in a
//! process group of its own; passes the command's stdout through live (in
//! plain mode) while keeping its first [`STDOUT_MAX_BYTES`] for the record;
//! forwards SIGINT, SIGTERM and SIGHUP sent to the runner; and stops the
//! command (SIGUSR1 to the guard: SIGKILL its group) as soon as a heartbeat
//! learns that another holder took over. It owns the run and its exit
//! code; claiming, recording and reporting are [`super`]'s.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

use oncekv_client::ClaimToken;

use super::guard::exit_code;
use super::record::{Record, STDOUT_MAX_BYTES};
use crate::cli::output::EXIT_FAILED;

/// How often the runner looks at the claim's heartbeat for a takeover.
const FENCE_CHECK: Duration = Duration::from_millis(100);
/// How long stdout is still read after the command exited (a process that
/// escaped its group may hold it open).
const STDOUT_GRACE: Duration = Duration::from_secs(1);

/// How a run ended.
#[derive(Debug)]
pub(super) enum Ran {
    /// The command exited (or a signal killed it): its record.
    Exited(Record),
    /// A heartbeat learnt that another holder took over, and the command
    /// was stopped (SIGKILL): what it had printed.
    Fenced(Record),
}

/// Runs `command` for the holder of `token`: the guard is this binary's
/// `once-guard`. In plain mode (`live`) the command's stdout is copied to
/// ours as it comes; either way its first bytes are kept for the record.
pub(super) async fn run(
    command: &[OsString],
    token: &ClaimToken,
    live: bool,
) -> std::io::Result<Ran> {
    // From now on these signals are passed on to the command, not obeyed.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let exe = std::env::current_exe()?;
    // A command in a background process group that reads the terminal is
    // stopped (SIGTTIN) — and would hold the key for ever, heartbeating.
    let stdin = if std::io::stdin().is_terminal() {
        Stdio::null()
    } else {
        Stdio::inherit()
    };
    let mut guard = tokio::process::Command::new(exe)
        .arg("once-guard")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(command)
        .env("ONCEKV_FENCE", token.fence.to_string())
        .env("ONCEKV_ATTEMPT", token.attempt.to_string())
        .env("ONCEKV_CLAIM_KEY", std::ffi::OsStr::from_bytes(&token.key))
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()?;
    let guard_pid = guard
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw);
    let forward = |signal: Signal| {
        if let Some(pid) = guard_pid {
            let _ = kill(pid, signal);
        }
    };
    let mut stdout = guard.stdout.take();
    let mut ours = tokio::io::stdout();
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buffer = vec![0u8; 16 << 10];
    let mut status = None;
    let mut fenced = false;
    let mut check = tokio::time::interval(FENCE_CHECK);
    let mut grace = Box::pin(tokio::time::sleep(Duration::MAX));
    while status.is_none() || stdout.is_some() {
        tokio::select! {
            read = async { stdout.as_mut()?.read(&mut buffer).await.ok() }, if stdout.is_some() => {
                match read {
                    Some(0) | None => stdout = None,
                    Some(count) => {
                        let chunk = &buffer[..count];
                        let room = STDOUT_MAX_BYTES - kept.len();
                        kept.extend_from_slice(&chunk[..count.min(room)]);
                        truncated |= count > room;
                        // A closed stdout of ours must not stop the command:
                        // keep reading (and recording) regardless.
                        if live && ours.write_all(chunk).await.is_ok() {
                            let _ = ours.flush().await;
                        }
                    }
                }
            }
            exited = guard.wait(), if status.is_none() => {
                // (Waiting cannot fail for a child of ours; were it to, the
                // run counts as failed rather than as never started.)
                status = Some(exited.map_or(EXIT_FAILED, exit_code));
                grace.as_mut().reset(tokio::time::Instant::now() + STDOUT_GRACE);
            }
            () = &mut grace, if status.is_some() => stdout = None,
            _ = interrupt.recv() => forward(Signal::SIGINT),
            _ = terminate.recv() => forward(Signal::SIGTERM),
            _ = hangup.recv() => forward(Signal::SIGHUP),
            _ = check.tick(), if !fenced && status.is_none() => {
                if token.is_fenced() {
                    // Another holder owns the effect now: stop at once.
                    fenced = true;
                    forward(Signal::SIGUSR1);
                }
            }
        }
    }
    let record = Record {
        exit_code: status.unwrap_or(EXIT_FAILED),
        stdout: kept,
        truncated,
    };
    Ok(if fenced {
        Ran::Fenced(record)
    } else {
        Ran::Exited(record)
    })
}
