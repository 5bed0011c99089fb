//! Authentication and roles on the client port: the HTTP-level layer that
//! finds who calls (a bearer token from the node's token file, else the
//! client certificate's name) and whether its role may call the method,
//! and hands the caller to the services as a request extension. It decides
//! nothing about sessions: a session's owner is checked by the registry
//! (rule 19), from the principal this layer found.
//!
//! Open to everyone, always: `Client/Status`, gRPC health and reflection.
//! Roles: `client` may call the `Client` service; `admin` the `Admin`
//! service and `Client`. Refusals: `UNAUTHENTICATED` (no credentials, or a
//! token not in the file) and `PERMISSION_DENIED` (a role without the
//! service), both final, with our `ErrorDetail` reason.
//!
//! Token file: one grant a line, `TOKEN PRINCIPAL ROLE`, blanks between;
//! `#` starts a comment. A TOKEN of `-` grants ROLE to the certificate whose
//! name is PRINCIPAL (no token). A client certificate signed by the cluster
//! CA and not listed has the role `client`.
//!
//! The policy can be replaced while the node runs ([`SharedPolicy`], on
//! SIGHUP): each request is decided by the policy current when it arrives.
//!
//! The HTTP API asks the same live policy ([`AuthPolicy::token_caller`],
//! tokens only) to refuse an unauthenticated caller from its headers,
//! before reading its body; the client port still decides its forwarded
//! calls.

use futures::future::BoxFuture;
use oncekv_core::Principal;
use oncekv_wire::status::{ErrorReason, reason_status};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// What a principal may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The `Client` service.
    Client,
    /// The `Admin` service and the `Client` service.
    Admin,
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        match text {
            "client" => Ok(Role::Client),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?} (client or admin)")),
        }
    }
}

/// Who calls, as the layer found it: put in each request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    pub role: Role,
}

/// The principal of a request: the authenticated caller's, or anonymous on
/// a node without authentication.
pub fn principal_of<T>(request: &tonic::Request<T>) -> Principal {
    request
        .extensions()
        .get::<Caller>()
        .map_or_else(Principal::anonymous, |caller| caller.principal.clone())
}

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {why}")]
    Line {
        path: std::path::PathBuf,
        line: usize,
        why: String,
    },
}

/// Who may call what: the grants of the token file, and whether client
/// certificates are accepted (the client port has TLS).
#[derive(Clone, Debug, Default)]
pub struct AuthPolicy {
    /// BLAKE3 of a token → its caller. Tokens are compared by hash, so the
    /// table never holds them and lookups take the same path for any token.
    tokens: BTreeMap<[u8; 32], Caller>,
    /// Roles granted to certificate principals (`-` lines).
    cert_roles: BTreeMap<Principal, Role>,
    certificates: bool,
    /// Off: every caller is anonymous and may call everything (a node
    /// without TLS and without a token file, loopback only by default).
    enabled: bool,
}

fn token_key(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// Least bytes in a token: a guessable token is no authentication.
pub const TOKEN_BYTES_MIN: usize = 16;

impl AuthPolicy {
    /// A policy from a token file's text (`path` names it in errors).
    pub fn parse(
        path: &Path,
        text: &str,
        certificates: bool,
    ) -> Result<AuthPolicy, TokenFileError> {
        let mut policy = AuthPolicy {
            certificates,
            enabled: true,
            ..AuthPolicy::default()
        };
        for (number, line) in text.lines().enumerate() {
            let bad = |why: String| TokenFileError::Line {
                path: path.to_path_buf(),
                line: number + 1,
                why,
            };
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [token, principal, role] = fields[..] else {
                return Err(bad("expected TOKEN PRINCIPAL ROLE".into()));
            };
            let role: Role = role.parse().map_err(bad)?;
            if principal.len() > Principal::BYTES_MAX {
                return Err(bad(format!(
                    "principal longer than {} bytes",
                    Principal::BYTES_MAX
                )));
            }
            let principal = Principal(principal.to_string());
            if token == "-" {
                if policy.cert_roles.insert(principal, role).is_some() {
                    return Err(bad("certificate principal listed twice".into()));
                }
                continue;
            }
            if token.len() < TOKEN_BYTES_MIN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!(
                    "a token is at least {TOKEN_BYTES_MIN} printable ASCII characters"
                )));
            }
            let caller = Caller { principal, role };
            if policy.tokens.insert(token_key(token), caller).is_some() {
                return Err(bad("token listed twice".into()));
            }
        }
        Ok(policy)
    }

    /// Reads a token file.
    pub fn load(path: &Path, certificates: bool) -> Result<AuthPolicy, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AuthPolicy::parse(path, &text, certificates)
    }

    /// Only client certificates (TLS without a token file).
    pub fn certificates_only() -> AuthPolicy {
        AuthPolicy {
            certificates: true,
            enabled: true,
            ..AuthPolicy::default()
        }
    }

    /// No authentication: everyone is the anonymous principal.
    pub fn off() -> AuthPolicy {
        AuthPolicy::default()
    }

    /// What the policy grants, for the log (never a token).
    pub fn summary(&self) -> String {
        if !self.enabled {
            return "no authentication".into();
        }
        format!(
            "{} token(s), {} certificate grant(s), client certificates {}",
            self.tokens.len(),
            self.cert_roles.len(),
            if self.certificates {
                "accepted"
            } else {
                "not accepted"
            }
        )
    }

    /// The caller `token` (the header's value after `Bearer `) is granted
    /// to, or why none.
    fn token_grant(&self, token: &str) -> Result<Caller, String> {
        self.tokens
            .get(&token_key(token))
            .cloned()
            .ok_or_else(|| "unknown bearer token".into())
    }

    /// Who calls with `token` alone, no client certificate (the HTTP API
    /// asks for none): `Ok(None)` when the policy is off (everyone is
    /// anonymous), the token's caller when it is in the file, otherwise
    /// why not — as the client port would decide the same call.
    pub fn token_caller(&self, token: Option<&str>) -> Result<Option<Caller>, String> {
        if !self.enabled {
            return Ok(None);
        }
        match token {
            Some(token) => self.token_grant(token).map(Some),
            None => Err(
                "this node requires credentials: a bearer token from its token file \
                 (Authorization: Bearer TOKEN)"
                    .into(),
            ),
        }
    }

    /// Who calls with `token` (the header's value after `Bearer `) or over a
    /// connection that showed `certificate` (DER).
    fn caller(
        &self,
        token: Option<&str>,
        certificate: Option<&[u8]>,
    ) -> Result<Caller, tonic::Status> {
        if let Some(token) = token {
            return self
                .token_grant(token)
                .map_err(|why| reason_status(ErrorReason::Unauthenticated(why)));
        }
        if let Some(der) = certificate.filter(|_| self.certificates) {
            // The rule the proxy names its callers by, too.
            let name = oncekv_wire::certificate::holder_name(der, Principal::BYTES_MAX)
                .map_err(|why| reason_status(ErrorReason::Unauthenticated(why.to_string())))?;
            let principal = Principal(name);
            let role = self
                .cert_roles
                .get(&principal)
                .copied()
                .unwrap_or(Role::Client);
            return Ok(Caller { principal, role });
        }
        Err(reason_status(ErrorReason::Unauthenticated(
            "this node requires credentials: a client certificate of the cluster CA or a \
             bearer token (--cert/--key or --token; ONCEKV_CERT/ONCEKV_KEY or ONCEKV_TOKEN)"
                .into(),
        )))
    }
}

/// What a method requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    Nothing,
    Role(Role),
    /// Not ours (an unknown service): authenticated, any role.
    Anyone,
}

fn need(path: &str) -> Need {
    if path == "/oncekv.v1.Client/Status"
        || path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.")
    {
        Need::Nothing
    } else if path.starts_with("/oncekv.v1.Admin/") {
        Need::Role(Role::Admin)
    } else if path.starts_with("/oncekv.v1.Client/") {
        Need::Role(Role::Client)
    } else {
        Need::Anyone
    }
}

/// The client port's policy, replaceable while the node runs: clones
/// share it, and each request is decided by the one current when it
/// arrives.
#[derive(Clone, Debug)]
pub struct SharedPolicy(Arc<RwLock<Arc<AuthPolicy>>>);

impl SharedPolicy {
    pub fn new(policy: AuthPolicy) -> SharedPolicy {
        SharedPolicy(Arc::new(RwLock::new(Arc::new(policy))))
    }

    pub fn current(&self) -> Arc<AuthPolicy> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Decides every request from now on by `policy`.
    pub fn replace(&self, policy: AuthPolicy) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }
}

/// Wraps the client server's routes; see the module docs.
#[derive(Clone)]
pub struct AuthLayer {
    policy: SharedPolicy,
}

impl AuthLayer {
    pub fn new(policy: SharedPolicy) -> AuthLayer {
        AuthLayer { policy }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            policy: self.policy.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    policy: SharedPolicy,
}

/// Decides one request: the caller to hand on, or the refusal.
fn admit<B>(
    policy: &AuthPolicy,
    request: &http::Request<B>,
) -> Result<Option<Caller>, tonic::Status> {
    let need = need(request.uri().path());
    if need == Need::Nothing || !policy.enabled {
        return Ok(None);
    }
    let token = match request.headers().get(oncekv_wire::AUTHORIZATION_KEY) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|value| value.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    reason_status(ErrorReason::Unauthenticated(
                        "malformed authorization header: expected \"Bearer TOKEN\"".into(),
                    ))
                })?,
        ),
    };
    let certs = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs());
    let certificate = certs
        .as_ref()
        .and_then(|certs| certs.first())
        .map(|cert| cert.as_ref());
    let caller = policy.caller(token, certificate)?;
    if let Need::Role(Role::Admin) = need
        && caller.role != Role::Admin
    {
        return Err(reason_status(ErrorReason::PermissionDenied(format!(
            "principal {} has role client; the Admin service needs role admin",
            caller.principal
        ))));
    }
    Ok(Some(caller))
}

impl<S, B> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match admit(&self.policy.current(), &request) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Box::pin(self.inner.call(request))
            }
            Err(status) => {
                tracing::info!(path = request.uri().path(), reason = %status.message(), "call refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# grants\n\
        0123456789abcdef-alice alice client\n\
        0123456789abcdef-root  root  admin  # operators\n\
        - ops-cert admin\n";

    fn policy() -> AuthPolicy {
        AuthPolicy::parse(Path::new("tokens"), FILE, true).unwrap()
    }

    fn request(path: &str, token: Option<&str>) -> http::Request<()> {
        let mut request = http::Request::builder().uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(()).unwrap()
    }

    /// A self-signed certificate (DER) with these names.
    fn certificate(common_name: Option<&str>, dns_names: &[&str]) -> Vec<u8> {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let mut params =
            CertificateParams::new(dns_names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let mut name = DistinguishedName::new();
        if let Some(common_name) = common_name {
            name.push(DnType::CommonName, common_name);
        }
        params.distinguished_name = name;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// A certificate names its principal by the proxy's rule
    /// (`oncekv_wire::certificate`): the first common name, else the first
    /// DNS name; a name with spaces or control characters names nobody.
    #[test]
    fn a_certificate_names_its_principal_by_the_shared_rule() {
        let policy = policy();
        let caller = |der: Vec<u8>| policy.caller(None, Some(&der));
        let alice = caller(certificate(Some("alice"), &["bob.example"])).unwrap();
        assert_eq!(alice.principal, Principal("alice".into()));
        assert_eq!(alice.role, Role::Client);
        let ops = caller(certificate(Some("ops-cert"), &[])).unwrap();
        assert_eq!(ops.role, Role::Admin, "the tokens file's certificate role");
        let by_dns = caller(certificate(None, &["carol.example"])).unwrap();
        assert_eq!(by_dns.principal, Principal("carol.example".into()));
        for der in [
            certificate(Some("al ice"), &[]),
            certificate(Some("alice\u{7}"), &[]),
            certificate(None, &[]),
            b"not a certificate".to_vec(),
        ] {
            let refused = caller(der).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        }
    }

    /// Tokens map to their principal and role; unknown tokens and missing
    /// credentials are UNAUTHENTICATED; a client role calling Admin is
    /// PERMISSION_DENIED; Status, health and reflection need nothing.
    #[test]
    fn roles_and_refusals() {
        let policy = policy();
        let alice = admit(
            &policy,
            &request("/oncekv.v1.Client/Execute", Some("0123456789abcdef-alice")),
        )
        .unwrap()
        .unwrap();
        assert_eq!(alice.principal, Principal("alice".into()));
        assert_eq!(alice.role, Role::Client);
        // Keyed execution is a client's call; the keys' admin RPCs are not.
        let keyed = admit(
            &policy,
            &request(
                "/oncekv.v1.Client/ExecuteKeyed",
                Some("0123456789abcdef-alice"),
            ),
        )
        .unwrap()
        .unwrap();
        assert_eq!(keyed.principal, Principal("alice".into()));
        for path in ["/oncekv.v1.Admin/ForgetKey", "/oncekv.v1.Admin/ListKeys"] {
            let denied =
                admit(&policy, &request(path, Some("0123456789abcdef-alice"))).unwrap_err();
            assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{path}");
        }
        let denied = admit(
            &policy,
            &request(
                "/oncekv.v1.Admin/AddLearner",
                Some("0123456789abcdef-alice"),
            ),
        )
        .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        let root = admit(
            &policy,
            &request("/oncekv.v1.Admin/AddLearner", Some("0123456789abcdef-root")),
        );
        assert_eq!(root.unwrap().unwrap().role, Role::Admin);
        for path in [
            "/oncekv.v1.Client/Register",
            "/oncekv.v1.Admin/SetConfig",
            "/other.Svc/X",
        ] {
            let refused = admit(&policy, &request(path, None)).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{path}");
            let wrong =
                admit(&policy, &request(path, Some("0123456789abcdef-nobody"))).unwrap_err();
            assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{path}");
        }
        for path in [
            "/oncekv.v1.Client/Status",
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        ] {
            assert_eq!(
                admit(&policy, &request(path, None)).unwrap(),
                None,
                "{path}"
            );
        }
    }

    /// Bad lines are refused with their line number.
    #[test]
    fn bad_token_files_are_refused() {
        for (text, line) in [
            ("short alice client\n", 1),
            ("# c\n0123456789abcdef-x x boss\n", 2),
            ("0123456789abcdef-x x\n", 1),
            (
                "0123456789abcdef-x x client\n0123456789abcdef-x y client\n",
                2,
            ),
        ] {
            match AuthPolicy::parse(Path::new("t"), text, false) {
                Err(TokenFileError::Line { line: found, .. }) => assert_eq!(found, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
