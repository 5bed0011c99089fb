//! The command's guard (`oncekv once-guard`, hidden): a small process that
//! `oncekv once` starts in place of the command, so that the command never
//! outlives its runner. The guard starts the command in a process group of
//! its own and then waits, watching three things: the command's exit (its
//! code becomes the guard's: 0–255, or 128 + N when a signal N killed it),
//! the signals its runner forwards (SIGINT, SIGTERM and SIGHUP are passed
//! on to the command's group; SIGUSR1 means "another holder took over":
//! SIGKILL the group), and its runner's life — the runner may die by
//! SIGKILL, which nothing can catch, so every 100 ms the guard checks that
//! its parent is still the runner, and if not SIGKILLs the command's whole
//! group (grandchildren included). When the command exits, whatever it
//! left running in its group is SIGKILLed too, as systemd does for a
//! service's leftover processes: nothing keeps acting on the key after its
//! result is recorded, or after a takeover.
//!
//! It owns that supervision only: claiming, heartbeats and recording are
//! the runner's ([`super`]). It must not write to stdout (the command's
//! stdout is the runner's pipe), and it cannot stop a process that leaves
//! the group on purpose (`setsid`, a daemon).

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getppid};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::output::{EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_NOT_FOUND};

/// How often the guard checks that its runner is alive.
const PARENT_CHECK: Duration = Duration::from_millis(100);

/// `oncekv once-guard --parent PID -- COMMAND [ARGS...]` (started by
/// `oncekv once` only).
#[derive(Debug, Clone, clap::Args)]
pub struct GuardArgs {
    /// The runner's pid: the command dies when this process is no longer
    /// the guard's parent.
    #[arg(long, value_name = "PID")]
    pub parent: i32,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Runs the command under guard; returns the exit code to exit with.
pub async fn run(args: &GuardArgs) -> i32 {
    let parent = Pid::from_raw(args.parent);
    let (Some(program), arguments) = (args.command.first(), args.command.get(1..)) else {
        eprintln!("oncekv once-guard: no command");
        return EXIT_FAILED;
    };
    // Handlers first: a signal forwarded before the command starts must not
    // kill the guard (it is then passed on once the command runs). Exec
    // resets caught signals, so the command gets the default actions.
    let streams = (|| {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::user_defined1())?,
        ))
    })();
    let (mut interrupt, mut terminate, mut hangup, mut take_over) = match streams {
        Ok(streams) => streams,
        Err(error) => {
            eprintln!("oncekv once: cannot handle signals: {error}");
            return EXIT_FAILED;
        }
    };
    if getppid() != parent {
        // The runner died before the command started: run nothing.
        return EXIT_FAILED;
    }
    let mut child = match tokio::process::Command::new(program)
        .args(arguments.unwrap_or_default())
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            let name = program.to_string_lossy();
            return if error.kind() == std::io::ErrorKind::NotFound {
                eprintln!("oncekv once: {name}: command not found");
                EXIT_NOT_FOUND
            } else {
                eprintln!("oncekv once: {name}: {error}");
                EXIT_CANNOT_RUN
            };
        }
    };
    let Some(group) = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw)
    else {
        return EXIT_FAILED;
    };
    let mut check = tokio::time::interval(PARENT_CHECK);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = interrupt.recv() => signal_group(group, Signal::SIGINT),
            _ = terminate.recv() => signal_group(group, Signal::SIGTERM),
            _ = hangup.recv() => signal_group(group, Signal::SIGHUP),
            _ = take_over.recv() => signal_group(group, Signal::SIGKILL),
            _ = check.tick() => {
                if getppid() != parent {
                    // The runner is gone (SIGKILLed, crashed): its claim will
                    // be taken over after the lease, so the command must not
                    // run on beside the next holder.
                    signal_group(group, Signal::SIGKILL);
                }
            }
        }
    };
    // Whatever the command left running in its group goes with it.
    signal_group(group, Signal::SIGKILL);
    match status {
        Ok(status) => exit_code(status),
        Err(error) => {
            eprintln!("oncekv once: cannot wait for the command: {error}");
            EXIT_FAILED
        }
    }
}

/// Sends `signal` to the process group `group` (gone already is fine).
fn signal_group(group: Pid, signal: Signal) {
    if let Err(error) = killpg(group, signal)
        && error != nix::errno::Errno::ESRCH
    {
        tracing::debug!(%error, ?signal, "cannot signal the command's group");
    }
}

/// A process's exit as a shell reports it: its code, or 128 + the signal
/// that killed it.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => EXIT_FAILED,
    }
}
