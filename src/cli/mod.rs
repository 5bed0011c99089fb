//! Command-line front ends for people: each submodule owns one subcommand's
//! talking to the cluster and its presentation (plain text or JSON). Argument
//! parsing of the whole binary and exiting belong to `main.rs` (the key-value
//! commands of `kv` return their documented exit code for it to exit with);
//! nothing here decides anything about the cluster.

pub mod admin;
pub mod bench;
pub mod failover;
pub mod health;
pub mod kv;
pub mod local_cluster;
pub mod status;

/// Client port base of the local cluster when `ONCEKV_PORT_BASE` is unset:
/// node N serves clients on base + N (as `scripts/cluster.sh` does).
pub const DEFAULT_PORT_BASE: u16 = 7100;

/// The client endpoints of the local 3-node cluster that `scripts/cluster.sh`
/// starts: `127.0.0.1:{base+1}`, `{base+2}`, `{base+3}`, where base is
/// `ONCEKV_PORT_BASE` (default 7100). An unusable value (not a number, or too
/// large for three ports above it) falls back to the default with a warning on
/// stderr, so a typo is visible rather than silently pointing elsewhere.
pub fn default_endpoints() -> Vec<String> {
    let base = match std::env::var("ONCEKV_PORT_BASE") {
        Err(_) => DEFAULT_PORT_BASE,
        Ok(text) => match parse_port_base(&text) {
            Some(base) => base,
            None => {
                eprintln!(
                    "warning: ignoring ONCEKV_PORT_BASE={text:?} (want a port number \
                     below 65533); using {DEFAULT_PORT_BASE}"
                );
                DEFAULT_PORT_BASE
            }
        },
    };
    endpoints_for_base(base)
}

/// `127.0.0.1:{base+1}` to `127.0.0.1:{base+3}`; `base` must be below 65533.
pub fn endpoints_for_base(base: u16) -> Vec<String> {
    (1..=3u16)
        .map(|node| format!("127.0.0.1:{}", base + node))
        .collect()
}

fn parse_port_base(text: &str) -> Option<u16> {
    text.trim()
        .parse::<u16>()
        .ok()
        .filter(|base| base.checked_add(3).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoints are the three client ports above the base.
    #[test]
    fn endpoints_are_the_three_ports_above_the_base() {
        assert_eq!(
            endpoints_for_base(7100),
            ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
        );
    }

    /// A base that is not a port, or leaves no room for three ports, is refused.
    #[test]
    fn unusable_port_bases_are_refused() {
        assert_eq!(parse_port_base(" 9000 "), Some(9000));
        assert_eq!(parse_port_base("65532"), Some(65532));
        assert_eq!(parse_port_base("65533"), None);
        assert_eq!(parse_port_base("-1"), None);
        assert_eq!(parse_port_base("x"), None);
    }
}
