//! The key-value commands' arguments: the clap structs (flattened into
//! the binary's subcommands), and their parsing into one [`KvRequest`] —
//! VALUE, ELEMENT, NEW and `--expected` as UTF-8 bytes, an i64 with
//! `--int`, comma-separated items with `put --list`. It only parses: a
//! VALUE that is not what its flag says is a usage failure (exit 2), and
//! calling the cluster is [`super`]'s.

use oncekv_core::{Command, Value};

use crate::cli::output::{EXIT_CODES_HELP, Failure};

/// The key-value commands, flattened into the binary's subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KvCommand {
    /// Store VALUE at KEY, replacing any value; prints OK.
    #[command(after_help = EXIT_CODES_HELP)]
    Put(PutArgs),
    /// Print the value at KEY (a linearizable read through the leader);
    /// nothing, "key not found" on stderr and exit 1 when it is absent.
    #[command(after_help = EXIT_CODES_HELP)]
    Get(KeyArgs),
    /// Delete KEY; prints "deleted", or "absent" when there was none.
    #[command(after_help = EXIT_CODES_HELP)]
    Del(DelArgs),
    /// Add DELTA (default 1) to the int at KEY (absent counts as 0); prints
    /// the new value.
    #[command(after_help = EXIT_CODES_HELP)]
    Incr(IncrArgs),
    /// Append ELEMENT to the list at KEY (absent counts as empty); prints the
    /// list's new length.
    #[command(after_help = EXIT_CODES_HELP)]
    Append(AppendArgs),
    /// Store NEW at KEY if its value is --expected (or it is --absent);
    /// prints "swapped <current>" or "not swapped <current>".
    #[command(after_help = EXIT_CODES_HELP)]
    Cas(CasArgs),
    /// Summarise every node's Status: id, role, applied index, live
    /// sessions, cluster time.
    #[command(after_help = EXIT_CODES_HELP)]
    Sessions(SessionsArgs),
}

/// `--idempotency-key K`, on the commands that change something.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KeyedArg {
    /// Run the command once per idempotency key K (UTF-8), with no
    /// session: running it again with the same K and the same command
    /// (within the key's TTL) answers the first run's result and executes
    /// nothing — a replay; K used with another command is KEY_CONFLICT
    /// (exit 4).
    #[arg(long, value_name = "K")]
    pub idempotency_key: Option<String>,
}

/// `put KEY VALUE [--int | --list]`.
#[derive(Debug, Clone, clap::Args)]
pub struct PutArgs {
    pub key: String,
    /// The value: UTF-8 bytes, an i64 with --int, comma-separated items
    /// with --list.
    #[arg(allow_hyphen_values = true)]
    pub value: String,
    /// Store VALUE as an i64.
    #[arg(long, conflicts_with = "list")]
    pub int: bool,
    /// Store VALUE as a list of comma-separated items ("" is the empty list).
    #[arg(long)]
    pub list: bool,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `get KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    pub key: String,
}

/// `del KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct DelArgs {
    pub key: String,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `incr KEY [DELTA]`.
#[derive(Debug, Clone, clap::Args)]
pub struct IncrArgs {
    pub key: String,
    /// How much to add; may be negative.
    #[arg(default_value_t = 1, allow_negative_numbers = true)]
    pub delta: i64,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `append KEY ELEMENT`.
#[derive(Debug, Clone, clap::Args)]
pub struct AppendArgs {
    pub key: String,
    /// The element, as UTF-8 bytes.
    #[arg(allow_hyphen_values = true)]
    pub element: String,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `cas KEY NEW (--expected VALUE | --absent) [--int]`.
#[derive(Debug, Clone, clap::Args)]
pub struct CasArgs {
    pub key: String,
    /// The value to store if the current one is as expected.
    #[arg(allow_hyphen_values = true)]
    pub new: String,
    /// Swap only if the current value equals this one.
    #[arg(
        long,
        value_name = "VALUE",
        allow_hyphen_values = true,
        required_unless_present = "absent",
        conflicts_with = "absent"
    )]
    pub expected: Option<String>,
    /// Swap only if the key is absent.
    #[arg(long)]
    pub absent: bool,
    /// NEW and --expected are i64s (otherwise UTF-8 bytes).
    #[arg(long)]
    pub int: bool,
    #[command(flatten)]
    pub keyed: KeyedArg,
}

/// `sessions`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {}

/// One key-value call, its arguments parsed: a read, or a command of the
/// registry to execute on KEY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KvRequest {
    /// `get KEY`: a linearizable read.
    Get { key: String },
    /// `put`, `del`, `incr`, `append` or `cas` on `key`.
    Execute { key: String, command: Command },
}

impl KvCommand {
    /// `--idempotency-key`, on the commands that take it.
    pub(super) fn idempotency_key(&self) -> Option<&str> {
        let keyed = match self {
            KvCommand::Put(args) => &args.keyed,
            KvCommand::Del(args) => &args.keyed,
            KvCommand::Incr(args) => &args.keyed,
            KvCommand::Append(args) => &args.keyed,
            KvCommand::Cas(args) => &args.keyed,
            KvCommand::Get(_) | KvCommand::Sessions(_) => return None,
        };
        keyed.idempotency_key.as_deref()
    }

    /// The call the arguments ask for; `None` for `sessions`, which names
    /// no key.
    pub(super) fn request(&self) -> Result<Option<KvRequest>, Failure> {
        let execute = |key: &str, command| {
            Some(KvRequest::Execute {
                key: key.to_owned(),
                command,
            })
        };
        let bytes = |key: &str| key.as_bytes().to_vec();
        Ok(match self {
            KvCommand::Sessions(_) => None,
            KvCommand::Get(args) => Some(KvRequest::Get {
                key: args.key.clone(),
            }),
            KvCommand::Put(args) => execute(
                &args.key,
                Command::Put {
                    key: bytes(&args.key),
                    value: parse_put_value(&args.value, args.int, args.list)?,
                },
            ),
            KvCommand::Del(args) => execute(
                &args.key,
                Command::Delete {
                    key: bytes(&args.key),
                },
            ),
            KvCommand::Incr(args) => execute(
                &args.key,
                Command::Increment {
                    key: bytes(&args.key),
                    delta: args.delta,
                },
            ),
            KvCommand::Append(args) => execute(
                &args.key,
                Command::Append {
                    key: bytes(&args.key),
                    element: args.element.as_bytes().to_vec(),
                },
            ),
            KvCommand::Cas(args) => execute(
                &args.key,
                Command::CompareAndSwap {
                    key: bytes(&args.key),
                    expected: args
                        .expected
                        .as_deref()
                        .map(|text| parse_scalar(text, args.int, "--expected"))
                        .transpose()?,
                    new: parse_scalar(&args.new, args.int, "NEW")?,
                },
            ),
        })
    }
}

/// `put`'s VALUE: bytes, an i64 (`int`) or comma-separated items (`list`).
fn parse_put_value(text: &str, int: bool, list: bool) -> Result<Value, Failure> {
    if list {
        let items = if text.is_empty() {
            Vec::new()
        } else {
            text.split(',')
                .map(|item| item.as_bytes().to_vec())
                .collect()
        };
        Ok(Value::List(items))
    } else {
        parse_scalar(text, int, "VALUE")
    }
}

/// Bytes, or with `int` an i64.
fn parse_scalar(text: &str, int: bool, what: &str) -> Result<Value, Failure> {
    if int {
        text.trim()
            .parse::<i64>()
            .map(Value::Int)
            .map_err(|error| Failure::usage(format!("invalid {what} {text:?} with --int: {error}")))
    } else {
        Ok(Value::Bytes(text.as_bytes().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cli::output::EXIT_USAGE;
    use crate::cli::{Cli, Command, CommonArgs};

    /// The key-value command `args` name, as the binary parses it.
    fn parse(args: &[&str]) -> Result<KvCommand, clap::Error> {
        parse_with_common(args).map(|(command, _)| command)
    }

    fn parse_with_common(args: &[&str]) -> Result<(KvCommand, CommonArgs), clap::Error> {
        let cli = Cli::try_parse_checked(std::iter::once("oncekv").chain(args.iter().copied()))?;
        match cli.command {
            Command::Kv(command) => Ok((command, cli.common)),
            other => panic!("{args:?} is not a key-value command: {other:?}"),
        }
    }

    /// `--int` parses an i64, `--list` splits on commas, anything else is bytes.
    #[test]
    fn put_values_parse_by_flag() {
        assert_eq!(
            parse_put_value("a,b", false, false).unwrap(),
            Value::Bytes(b"a,b".to_vec())
        );
        assert_eq!(
            parse_put_value("-42", true, false).unwrap(),
            Value::Int(-42)
        );
        assert_eq!(
            parse_put_value("a,,b", false, true).unwrap(),
            Value::List(vec![b"a".to_vec(), Vec::new(), b"b".to_vec()])
        );
        assert_eq!(
            parse_put_value("", false, true).unwrap(),
            Value::List(Vec::new())
        );
        let failure = parse_put_value("12x", true, false).unwrap_err();
        assert_eq!(failure.exit(), EXIT_USAGE);
        assert!(
            failure.message().contains("\"12x\""),
            "{}",
            failure.message()
        );
    }

    /// The arguments become the registry's own command on the key's bytes;
    /// `get` is a read, and `sessions` names no key.
    #[test]
    fn arguments_become_requests() {
        let request = |args: &[&str]| parse(args).unwrap().request();
        assert_eq!(
            request(&["get", "k"]).unwrap(),
            Some(KvRequest::Get { key: "k".into() })
        );
        assert_eq!(request(&["sessions"]).unwrap(), None);
        assert_eq!(
            request(&["append", "k", "e"]).unwrap(),
            Some(KvRequest::Execute {
                key: "k".into(),
                command: oncekv_core::Command::Append {
                    key: b"k".to_vec(),
                    element: b"e".to_vec(),
                },
            })
        );
        assert_eq!(
            request(&["cas", "k", "2", "--int", "--expected", "1"]).unwrap(),
            Some(KvRequest::Execute {
                key: "k".into(),
                command: oncekv_core::Command::CompareAndSwap {
                    key: b"k".to_vec(),
                    expected: Some(Value::Int(1)),
                    new: Value::Int(2),
                },
            })
        );
        let failure = request(&["put", "k", "x", "--int"]).unwrap_err();
        assert_eq!(failure.exit(), EXIT_USAGE);
    }

    /// Negative numbers and dash-leading values are values, not flags.
    #[test]
    fn negative_numbers_are_values() {
        let (KvCommand::Incr(args), common) =
            parse_with_common(&["incr", "k", "-3", "--json"]).unwrap()
        else {
            panic!("not incr");
        };
        assert_eq!(args.delta, -3);
        assert!(common.json);
        let KvCommand::Put(args) = parse(&["put", "k", "-5", "--int"]).unwrap() else {
            panic!("not put");
        };
        assert_eq!((args.value.as_str(), args.int), ("-5", true));
        let KvCommand::Cas(args) = parse(&["cas", "k", "-1", "--int", "--expected", "-2"]).unwrap()
        else {
            panic!("not cas");
        };
        assert_eq!(args.expected.as_deref(), Some("-2"));
        assert_eq!(args.new, "-1");
    }

    /// The defaults, and the argument rules clap enforces (exit 2).
    #[test]
    fn argument_rules() {
        let (KvCommand::Incr(args), common) = parse_with_common(&["incr", "k"]).unwrap() else {
            panic!("not incr");
        };
        assert_eq!(args.delta, 1);
        assert_eq!(common.timeout(), Duration::from_millis(10_000));
        assert!(common.endpoints.is_empty());
        let (KvCommand::Get(_), common) =
            parse_with_common(&["get", "k", "--endpoints", "a:1,b:2"]).unwrap()
        else {
            panic!("not get");
        };
        assert_eq!(common.endpoints, ["a:1", "b:2"]);
        for bad in [
            &["cas", "k", "v"][..],
            &["cas", "k", "v", "--absent", "--expected", "x"],
            &["put", "k", "v", "--int", "--list"],
            &["put", "k"],
            &["incr", "k", "x"],
            &["get", "k", "--timeout-ms", "0"],
            &["--timeout-ms", "0", "get", "k"],
        ] {
            let error = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), EXIT_USAGE, "{bad:?}");
        }
    }

    /// The common flags mean the same before the subcommand, after it, or
    /// between its arguments, for every key-value command.
    #[test]
    fn common_flags_go_anywhere() {
        let expected = CommonArgs {
            endpoints: vec!["a:1".into(), "b:2".into()],
            json: true,
            timeout_ms: Some(300),
            ..CommonArgs::default()
        };
        let flags = ["--json", "--endpoints", "a:1,b:2", "--timeout-ms", "300"];
        for command in [
            &["put", "k", "v"][..],
            &["get", "k"],
            &["del", "k"],
            &["incr", "k", "2"],
            &["append", "k", "x"],
            &["cas", "k", "v", "--absent"],
            &["sessions"],
        ] {
            let before: Vec<&str> = flags.iter().chain(command).copied().collect();
            let after: Vec<&str> = command.iter().chain(&flags).copied().collect();
            let mut between: Vec<&str> = vec![command[0], flags[0]];
            between.extend(&command[1..]);
            between.extend(&flags[1..]);
            for args in [before, after, between] {
                let (_, common) =
                    parse_with_common(&args).unwrap_or_else(|error| panic!("{args:?}: {error}"));
                assert_eq!(common, expected, "{args:?}");
            }
        }
    }

    /// `--idempotency-key` parses on the commands that change something,
    /// and not on `get`.
    #[test]
    fn idempotency_key_flag() {
        for args in [
            &["put", "k", "v", "--idempotency-key", "ik"][..],
            &["del", "k", "--idempotency-key", "ik"],
            &["incr", "k", "--idempotency-key", "ik"],
            &["incr", "k", "-2", "--idempotency-key", "ik"],
            &["append", "k", "e", "--idempotency-key", "ik"],
            &["cas", "k", "v", "--absent", "--idempotency-key", "ik"],
        ] {
            let command = parse(args).unwrap_or_else(|error| panic!("{args:?}: {error}"));
            assert_eq!(command.idempotency_key(), Some("ik"), "{args:?}");
        }
        assert_eq!(parse(&["incr", "k"]).unwrap().idempotency_key(), None);
        let error = parse(&["get", "k", "--idempotency-key", "ik"]).unwrap_err();
        assert_eq!(error.exit_code(), EXIT_USAGE);
    }
}
