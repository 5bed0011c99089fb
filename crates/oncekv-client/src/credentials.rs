//! What a client shows a node: the CA it trusts for the node's certificate,
//! its own certificate and key (mutual TLS), and a bearer token — and how a
//! channel to one endpoint is built from them. Shared by the client library
//! and the CLI; it reads files and the environment it is pointed at, and
//! never decides what a node accepts (that is the server's `network::auth`).
//!
//! Environment: `ONCEKV_CA`, `ONCEKV_CERT`, `ONCEKV_KEY` (PEM file paths)
//! and `ONCEKV_TOKEN` (the token itself).

use oncekv_wire::AUTHORIZATION_KEY;
use std::fmt;
use std::path::{Path, PathBuf};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A channel that adds the bearer token (if any) to every call.
pub type AuthChannel = InterceptedService<Channel, BearerToken>;

/// Why credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "a client certificate needs its key too (--cert with --key, ONCEKV_CERT with ONCEKV_KEY)"
    )]
    CertWithoutKey,
    #[error("a certificate or key without --ca (ONCEKV_CA): TLS needs the cluster's CA")]
    IdentityWithoutCa,
    #[error("the token must be printable ASCII without blanks")]
    BadToken,
}

/// Where the credentials come from; `None` fields are not given.
#[derive(Clone, Debug, Default)]
pub struct CredentialPaths {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub token: Option<String>,
}

impl CredentialPaths {
    /// The `ONCEKV_*` environment variables.
    pub fn from_env() -> CredentialPaths {
        let var = |name| std::env::var_os(name).filter(|value| !value.is_empty());
        CredentialPaths {
            ca: var("ONCEKV_CA").map(PathBuf::from),
            cert: var("ONCEKV_CERT").map(PathBuf::from),
            key: var("ONCEKV_KEY").map(PathBuf::from),
            token: std::env::var("ONCEKV_TOKEN").ok().filter(|t| !t.is_empty()),
        }
    }

    /// Each field of `self`, else the one of `fallback`.
    pub fn or(self, fallback: CredentialPaths) -> CredentialPaths {
        CredentialPaths {
            ca: self.ca.or(fallback.ca),
            cert: self.cert.or(fallback.cert),
            key: self.key.or(fallback.key),
            token: self.token.or(fallback.token),
        }
    }
}

/// The credentials of this process's command line, when a program sets
/// them ([`Credentials::set_process_default`]); helpers that are not handed
/// credentials (a `Status` probe, say) use them, else the environment.
static PROCESS_DEFAULT: std::sync::OnceLock<Credentials> = std::sync::OnceLock::new();

/// Loaded credentials; cheap to clone.
#[derive(Clone, Default)]
pub struct Credentials {
    tls: Option<ClientTlsConfig>,
    token: BearerToken,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.0.is_some())
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CredentialsError> {
    std::fs::read(path).map_err(|source| CredentialsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl Credentials {
    /// No TLS, no token: plain connections (a node without authentication).
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// Reads the files `paths` names.
    pub fn load(paths: &CredentialPaths) -> Result<Credentials, CredentialsError> {
        let tls = match (&paths.ca, &paths.cert, &paths.key) {
            (None, None, None) => None,
            (None, _, _) => return Err(CredentialsError::IdentityWithoutCa),
            (Some(_), Some(_), None) | (Some(_), None, Some(_)) => {
                return Err(CredentialsError::CertWithoutKey);
            }
            (Some(ca), cert, key) => {
                let mut tls =
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
                if let (Some(cert), Some(key)) = (cert, key) {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                Some(tls)
            }
        };
        let token = match &paths.token {
            None => BearerToken(None),
            Some(token) => BearerToken::new(token)?,
        };
        Ok(Credentials { tls, token })
    }

    /// Makes `credentials` what [`Credentials::process_default`] returns
    /// (the first call wins).
    pub fn set_process_default(credentials: Credentials) {
        let _ = PROCESS_DEFAULT.set(credentials);
    }

    /// The credentials set for this process, else those of the `ONCEKV_*`
    /// environment, else none (unreadable files count as none: the call
    /// that uses them then fails and says so).
    pub fn process_default() -> Credentials {
        match PROCESS_DEFAULT.get() {
            Some(credentials) => credentials.clone(),
            None => Credentials::load(&CredentialPaths::from_env()).unwrap_or_default(),
        }
    }

    /// Whether connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// An endpoint for `host_port` (`HOST:PORT`): `https` with these
    /// credentials' TLS, else plain `http`.
    pub fn endpoint(&self, host_port: &str) -> Result<Endpoint, tonic::transport::Error> {
        match &self.tls {
            None => Endpoint::from_shared(format!("http://{host_port}")),
            Some(tls) => {
                Endpoint::from_shared(format!("https://{host_port}"))?.tls_config(tls.clone())
            }
        }
    }

    /// These credentials showing `token` instead of their own token (the
    /// HTTP API passes each caller's token through this way).
    pub fn with_token(&self, token: BearerToken) -> Credentials {
        Credentials {
            tls: self.tls.clone(),
            token,
        }
    }

    /// What adds the token to each call.
    pub fn bearer(&self) -> BearerToken {
        self.token.clone()
    }

    /// `channel` with the token added to each call.
    pub fn wrap(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, self.bearer())
    }
}

/// Adds `authorization: Bearer TOKEN` to every call when a token is set.
#[derive(Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl BearerToken {
    pub fn new(token: &str) -> Result<BearerToken, CredentialsError> {
        if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(CredentialsError::BadToken);
        }
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| CredentialsError::BadToken)?;
        Ok(BearerToken(Some(value)))
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_KEY, value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partial TLS settings are refused with what is missing; blanks in a
    /// token are refused.
    #[test]
    fn partial_settings_are_refused() {
        let paths = CredentialPaths {
            cert: Some("c.pem".into()),
            ..CredentialPaths::default()
        };
        assert!(matches!(
            Credentials::load(&paths),
            Err(CredentialsError::IdentityWithoutCa)
        ));
        assert!(matches!(
            BearerToken::new("a b"),
            Err(CredentialsError::BadToken)
        ));
        assert!(BearerToken::new("abc").is_ok());
        assert!(
            !Credentials::load(&CredentialPaths::default())
                .unwrap()
                .uses_tls()
        );
    }
}
