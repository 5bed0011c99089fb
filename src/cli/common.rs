//! What the common flags ([`CommonArgs`]) mean to the key-value and admin
//! commands: the endpoints to call (normalised to `host:port`, else the
//! local cluster's, [`super::default_endpoints`]) and the command's default
//! deadline. It only reads flags; a malformed one is a usage failure for
//! the caller to report.

use std::time::Duration;

use super::CommonArgs;
use super::default_endpoints;
use super::output::Failure;

/// Default deadline of a key-value or admin command.
pub const TIMEOUT_MS_DEFAULT: u64 = 10_000;

impl CommonArgs {
    /// The command's deadline: `--timeout-ms`, default 10 s.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout_or(TIMEOUT_MS_DEFAULT)
    }

    /// `--endpoints`, normalised; the local cluster's when none is given.
    pub(super) fn endpoints(&self) -> Result<Vec<String>, Failure> {
        if self.endpoints.is_empty() {
            Ok(default_endpoints())
        } else {
            normalize_endpoints(&self.endpoints)
        }
    }
}

/// `host:port` endpoints without blanks; a leading `http://` is dropped (the
/// client library adds it). Empty entries are ignored; none left, another
/// scheme, or no port in 1..=65535 after the last `:`, is a usage error.
fn normalize_endpoints(given: &[String]) -> Result<Vec<String>, Failure> {
    let mut endpoints = Vec::new();
    for endpoint in given.iter().map(|endpoint| endpoint.trim()) {
        if endpoint.is_empty() {
            continue;
        }
        let endpoint = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        if endpoint.contains("://") {
            return Err(Failure::usage(format!(
                "endpoint {endpoint:?}: give host:port (plain http only)"
            )));
        }
        let endpoint = endpoint.trim_end_matches('/');
        let port = endpoint.rsplit_once(':').map(|(_, port)| port);
        if port
            .and_then(|port| port.parse::<u16>().ok())
            .is_none_or(|port| port == 0)
        {
            return Err(Failure::usage(format!(
                "endpoint {endpoint:?}: give host:port, the port in 1..=65535"
            )));
        }
        endpoints.push(endpoint.to_owned());
    }
    if endpoints.is_empty() {
        return Err(Failure::usage("--endpoints names no endpoint"));
    }
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::output::EXIT_USAGE;

    /// Endpoints are trimmed, `http://` is dropped, other schemes and an
    /// empty list are usage errors.
    #[test]
    fn endpoints_are_normalized() {
        let given = [" 127.0.0.1:1 ", "", "http://h:2/"].map(String::from);
        assert_eq!(normalize_endpoints(&given).unwrap(), ["127.0.0.1:1", "h:2"]);
        assert_eq!(
            normalize_endpoints(&["https://h:1".to_owned()])
                .unwrap_err()
                .exit(),
            EXIT_USAGE
        );
        assert_eq!(
            normalize_endpoints(&[String::new()]).unwrap_err().exit(),
            EXIT_USAGE
        );
        for bad in ["127.0.0.1:99999", "h", "h:0", "h:x"] {
            assert_eq!(
                normalize_endpoints(&[bad.to_owned()]).unwrap_err().exit(),
                EXIT_USAGE,
                "{bad}"
            );
        }
        assert_eq!(
            normalize_endpoints(&["[::1]:7101".to_owned()]).unwrap(),
            ["[::1]:7101"]
        );
    }
}
