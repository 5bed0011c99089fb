//! Who may use the proxy (`oncekv proxy --callers-file FILE`): a bearer
//! token per caller in the `Proxy-Authorization` header, checked before
//! anything is read, claimed or forwarded. The proxy reaches the cluster
//! with one identity of its own, so without this file (or client
//! certificates, `--callers-ca`, in [`crate::listener_tls`]) everyone who
//! can reach its port acts as that identity; with it, a caller is known by
//! name, and its name scopes its idempotency keys (one caller can neither
//! replay nor block another's key). It owns the file's format and the
//! check; it never forwards the header (the upstream has its own
//! `Authorization`) and never holds a token, only its hash.
//!
//! The file can change while the proxy runs: [`SharedCallers`] holds the
//! list in force, and `oncekv proxy` reloads it on SIGHUP — a file that
//! reads and parses replaces the list for every request from then on; one
//! that does not leaves the old list in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use http::{HeaderMap, header};

/// Least bytes in a token (the node's token file has the same rule).
pub const TOKEN_BYTES_MIN: usize = 16;
/// Most bytes in a caller's name.
pub const NAME_BYTES_MAX: usize = 256;

/// The callers file, parsed: BLAKE3 of each token → its caller's name.
#[derive(Debug, Clone)]
pub struct Callers {
    by_token: BTreeMap<[u8; 32], String>,
}

fn token_hash(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

impl Callers {
    /// Parses the file's text: one `TOKEN NAME` per line, `#` comments
    /// and blank lines ignored. `path` names the file in errors.
    pub fn parse(text: &str, path: &str) -> Result<Callers, String> {
        let mut by_token = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            let bad = |why: &str| format!("{path}:{}: {why}", number + 1);
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [token, name] = fields[..] else {
                return Err(bad("expected `TOKEN NAME`"));
            };
            if token.len() < TOKEN_BYTES_MIN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(&format!(
                    "a token is at least {TOKEN_BYTES_MIN} printable ASCII characters"
                )));
            }
            if name.len() > NAME_BYTES_MAX {
                return Err(bad(&format!("a name is at most {NAME_BYTES_MAX} bytes")));
            }
            if by_token
                .insert(token_hash(token), name.to_owned())
                .is_some()
            {
                return Err(bad("token listed twice"));
            }
        }
        if by_token.is_empty() {
            return Err(format!(
                "{path}: no callers (one `TOKEN NAME` per line); nobody could use the proxy"
            ));
        }
        Ok(Callers { by_token })
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Callers, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read the callers file {}: {error}", path.display()))?;
        Callers::parse(&text, &path.display().to_string())
    }

    /// How many callers the file names.
    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    /// Whether the file names nobody (never true of a parsed file).
    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// The caller of a request: the name of the token in its one
    /// `Proxy-Authorization: Bearer TOKEN` header, or why there is none
    /// (said without the token).
    pub fn caller<'a>(&'a self, headers: &HeaderMap) -> Result<&'a str, String> {
        let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Err("this proxy needs `Proxy-Authorization: Bearer TOKEN`".to_owned());
        };
        if values.next().is_some() {
            return Err("Proxy-Authorization is given more than once".to_owned());
        }
        // The scheme's name is case-insensitive (RFC 9110 §11.1): `bearer`
        // and `BEARER` are `Bearer`.
        let token = value
            .to_str()
            .ok()
            .and_then(|text| text.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| "Proxy-Authorization is not `Bearer TOKEN`".to_owned())?;
        self.by_token
            .get(&token_hash(token))
            .map(String::as_str)
            .ok_or_else(|| "the Proxy-Authorization token is not one of this proxy's".to_owned())
    }
}

/// The callers list in force and the file it came from; replaced whole by
/// [`SharedCallers::reload`].
#[derive(Debug)]
pub struct SharedCallers {
    path: PathBuf,
    current: RwLock<Arc<Callers>>,
}

impl SharedCallers {
    /// Reads the file at `path` (an error if it does not read and parse).
    pub fn load(path: &Path) -> Result<SharedCallers, String> {
        Ok(SharedCallers {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(Callers::load(path)?)),
        })
    }

    /// The list in force now.
    pub fn current(&self) -> Arc<Callers> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Reads the file again: on success the new list is in force for every
    /// request from now on and the number of callers it names is returned;
    /// on failure the old list stays in force and the error says why.
    pub fn reload(&self) -> Result<usize, String> {
        let callers = Callers::load(&self.path)?;
        let count = callers.len();
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(callers);
        Ok(count)
    }

    /// The file the list is read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const FILE: &str = "# billing and shipping\n\
        billing-token-0123456789 billing\n\
        \n\
        shipping-token-012345678 shipping\n";

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn a_listed_token_names_its_caller_and_nothing_else_does() {
        let callers = Callers::parse(FILE, "callers").unwrap();
        assert_eq!(callers.len(), 2);
        assert_eq!(
            callers.caller(&with("Bearer billing-token-0123456789")),
            Ok("billing")
        );
        assert_eq!(
            callers.caller(&with("Bearer shipping-token-012345678")),
            Ok("shipping")
        );
        // The scheme in any case (RFC 9110 §11.1), extra blanks around the token.
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert_eq!(
                callers.caller(&with(&format!("{scheme}  shipping-token-012345678 "))),
                Ok("shipping"),
                "{scheme}"
            );
        }
        assert!(callers.caller(&with("Bearer")).is_err());
        assert!(callers.caller(&with("Bearer ")).is_err());
        assert!(
            callers
                .caller(&with("Bearerbilling-token-0123456789"))
                .is_err()
        );
        assert!(callers.caller(&HeaderMap::new()).is_err());
        assert!(
            callers
                .caller(&with("Bearer nobody-token-0123456789"))
                .is_err()
        );
        assert!(
            callers
                .caller(&with("Basic billing-token-0123456789"))
                .is_err()
        );
        let mut twice = with("Bearer billing-token-0123456789");
        twice.append(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Bearer shipping-token-012345678"),
        );
        assert!(callers.caller(&twice).is_err());
        let refused = callers
            .caller(&with("Bearer billing-token-012345678X"))
            .unwrap_err();
        assert!(!refused.contains("billing-token"), "{refused}");
    }

    #[test]
    fn bad_files_are_refused_with_their_line() {
        for (text, line) in [
            ("short billing\n", ":1:"),
            ("# c\nbilling-token-0123456789\n", ":2:"),
            ("billing-token-0123456789 a b\n", ":1:"),
            (
                "billing-token-0123456789 a\nbilling-token-0123456789 b\n",
                ":2:",
            ),
        ] {
            let error = Callers::parse(text, "callers").unwrap_err();
            assert!(error.contains(line), "{text:?}: {error}");
        }
        assert!(Callers::parse("# nobody\n", "callers").is_err());
    }

    #[test]
    fn a_reload_replaces_the_list_only_when_the_file_parses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers");
        std::fs::write(&path, FILE).unwrap();
        let shared = SharedCallers::load(&path).unwrap();
        let billing = with("Bearer billing-token-0123456789");
        let audit = with("Bearer audit-token-0123456789x");
        assert!(shared.current().caller(&billing).is_ok());
        assert!(shared.current().caller(&audit).is_err());
        // A token removed and one added.
        std::fs::write(&path, "audit-token-0123456789x audit\n").unwrap();
        assert_eq!(shared.reload(), Ok(1));
        assert!(shared.current().caller(&billing).is_err());
        assert_eq!(shared.current().caller(&audit), Ok("audit"));
        // A broken file leaves the list in force.
        std::fs::write(&path, "short audit\n").unwrap();
        assert!(shared.reload().is_err());
        assert_eq!(shared.current().caller(&audit), Ok("audit"));
        std::fs::remove_file(&path).unwrap();
        assert!(shared.reload().is_err());
        assert_eq!(shared.current().caller(&audit), Ok("audit"));
    }
}
