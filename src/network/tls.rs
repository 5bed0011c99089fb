//! TLS of a node's two ports: loading the node's certificate, key and the
//! cluster CA, the rustls settings of the client and peer servers, the TLS
//! of the channels a node opens to its peers, and reading the names in a
//! certificate. It decides who a *peer* is (the node id its certificate
//! names); who a *client* is and what it may do is `network::auth`'s.
//!
//! Naming convention (what `oncekv certs` issues):
//! - a node's certificate names `node-<id>` as its common name and as a DNS
//!   subject alternative name, next to the host names and IP addresses it
//!   is reached at (`localhost`, `127.0.0.1`, a host name...);
//! - on the peer port TLS is mutual: only certificates signed by the cluster
//!   CA get through the handshake, and a message claiming to come from node
//!   N is refused unless the sender's certificate names `node-N`; a node
//!   dialling node N checks that the certificate presented names `node-N`;
//! - on the client port a client certificate is optional (a bearer token
//!   may stand in), and when shown must be signed by the cluster CA.

use crate::raft_types::NodeId;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The name a node's certificate carries: `node-<id>`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}")
}

/// Where a node's TLS material is.
#[derive(Clone, Debug)]
pub struct TlsPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

/// A node's loaded TLS material.
#[derive(Clone)]
pub struct NodeTls {
    identity: Identity,
    ca: Certificate,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeTls")
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks that `pem` holds at least one certificate that parses.
fn check_certificate_pem(path: &Path, pem: &[u8]) -> Result<(), TlsError> {
    let invalid = |why: String| TlsError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|error| invalid(format!("not a PEM certificate: {error}")))?;
    block
        .parse_x509()
        .map_err(|error| invalid(format!("not an X.509 certificate: {error}")))?;
    Ok(())
}

impl NodeTls {
    /// Reads and checks the files: certificates must parse (the key is
    /// checked when the first server starts with it).
    pub fn load(paths: &TlsPaths) -> Result<NodeTls, TlsError> {
        let cert = read(&paths.cert)?;
        let key = read(&paths.key)?;
        let ca = read(&paths.ca)?;
        check_certificate_pem(&paths.cert, &cert)?;
        check_certificate_pem(&paths.ca, &ca)?;
        if !String::from_utf8_lossy(&key).contains("PRIVATE KEY-----") {
            return Err(TlsError::Invalid {
                path: paths.key.clone(),
                why: "not a PEM private key".into(),
            });
        }
        Ok(NodeTls {
            identity: Identity::from_pem(cert, key),
            ca: Certificate::from_pem(ca),
        })
    }

    /// The client port: the node's certificate; a client certificate is
    /// optional (a token may stand in) but must be signed by the cluster CA.
    pub fn client_port(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .client_auth_optional(true)
    }

    /// The peer port: mutual TLS, only certificates of the cluster CA.
    pub fn peer_port(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
    }

    /// The TLS of a channel to node `target`: its certificate must be signed
    /// by the cluster CA and name `node-<target>`; ours goes with it.
    fn peer_client(&self, target: NodeId) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
            .domain_name(node_name(target))
    }
}

/// A server builder with `tls` when given.
pub fn server(
    tls: Option<ServerTlsConfig>,
) -> Result<tonic::transport::Server, tonic::transport::Error> {
    let server = tonic::transport::Server::builder();
    match tls {
        None => Ok(server),
        Some(tls) => server.tls_config(tls),
    }
}

/// The endpoint a node dials to reach node `target` at `dial`: TLS when
/// the node has it, plain otherwise.
pub fn peer_endpoint(
    tls: Option<&NodeTls>,
    dial: &str,
    target: NodeId,
) -> Result<Endpoint, tonic::transport::Error> {
    match tls {
        None => Endpoint::from_shared(format!("http://{dial}")),
        Some(tls) => {
            Endpoint::from_shared(format!("https://{dial}"))?.tls_config(tls.peer_client(target))
        }
    }
}

/// The names a certificate carries: its subject's common name and its DNS
/// subject alternative names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertNames {
    pub common_name: Option<String>,
    pub dns_names: Vec<String>,
}

impl CertNames {
    /// Whether the certificate names `name` (as common name or DNS name).
    pub fn names(&self, name: &str) -> bool {
        self.common_name.as_deref() == Some(name) || self.dns_names.iter().any(|dns| dns == name)
    }
}

/// The names in a DER certificate; `None` if it does not parse.
pub fn cert_names(der: &[u8]) -> Option<CertNames> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(CertNames {
        common_name,
        dns_names,
    })
}

/// What a peer connection's certificate lets its messages claim. On the
/// peer port a message claiming to come from node N must come over a
/// connection whose certificate names `node-N`; a stream's messages are
/// each checked against the certificate of the one connection they share.
/// Without TLS on the peer port (a loopback-only node) there is no
/// certificate and nothing to check.
#[derive(Clone, Debug)]
pub struct PeerClaim {
    /// `None`: no TLS, every claim passes. `Some(None)`: a certificate
    /// whose names could not be read, no claim passes.
    names: Option<Option<CertNames>>,
}

impl PeerClaim {
    /// The certificate of the connection `request` came over.
    pub fn of<T>(request: &tonic::Request<T>) -> PeerClaim {
        PeerClaim {
            names: request
                .peer_certs()
                .map(|certs| certs.first().and_then(|cert| cert_names(cert.as_ref()))),
        }
    }

    /// Whether a message may claim to come from `from_node_id`.
    #[allow(clippy::result_large_err)] // tonic::Status is what the handlers return
    pub fn check(&self, from_node_id: NodeId) -> Result<(), tonic::Status> {
        let Some(names) = &self.names else {
            return Ok(());
        };
        let claimed = node_name(from_node_id);
        if names.as_ref().is_some_and(|names| names.names(&claimed)) {
            return Ok(());
        }
        tracing::warn!(
            from_node_id,
            certificate = ?names,
            "peer message whose certificate does not name the node it claims to be"
        );
        Err(oncekv_wire::status::reason_status(
            oncekv_wire::status::ErrorReason::PermissionDenied(format!(
                "the peer certificate does not name {claimed}"
            )),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of a certificate are read as issued: the common name and
    /// every DNS name (IP addresses are not names of a principal or node).
    #[test]
    fn names_of_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec![
            "node-3".to_string(),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node-3");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let names = cert_names(cert.der()).expect("parses");
        assert_eq!(names.common_name.as_deref(), Some("node-3"));
        assert_eq!(names.dns_names, ["node-3", "localhost"]);
        assert!(names.names(&node_name(3)));
        assert!(!names.names(&node_name(2)));
        assert!(!names.names("127.0.0.1"));
        assert_eq!(cert_names(b"not a certificate"), None);
    }
}
