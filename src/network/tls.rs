//! TLS of a node's ports: loading the node's certificate, key and the
//! cluster CA into the rustls settings of the client, peer and HTTP
//! servers and of the connections a node opens to its peers; reloading
//! them (SIGHUP) without dropping the node. It decides who a *peer* is
//! (the node id its certificate names, read with
//! `oncekv_wire::certificate::cert_names`); who a *client* is and what it
//! may do is `network::auth`'s.
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
//!
//! Reloading: every new connection, accepted or dialled, handshakes with
//! the settings current at that moment, so a reload takes effect for new
//! connections at once while open ones go on with the settings they were
//! made with. A reload that cannot read or use the new files changes
//! nothing.

use super::connections::{Admitted, Gate};
use crate::raft_types::NodeId;
use futures::Stream;
use oncekv_wire::certificate::{CertNames, cert_names};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Channel, Endpoint};
use x509_parser::prelude::{FromDer, X509Certificate};

/// The name a node's certificate carries: `node-<id>`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}")
}

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// ALPN of gRPC (HTTP/2), which tonic's clients insist on.
const ALPN_H2: &[u8] = b"h2";
/// ALPN of the HTTP/JSON API.
const ALPN_HTTP1: &[u8] = b"http/1.1";

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

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// The certificates of a PEM file; each must parse as X.509.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(path, format!("not a PEM certificate: {error}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "not a PEM certificate: no certificate in it"));
    }
    for cert in &certs {
        X509Certificate::from_der(cert.as_ref())
            .map_err(|error| invalid(path, format!("not an X.509 certificate: {error}")))?;
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls settings built from one reading of the files: what every
/// port handshakes with until the next successful reload.
struct Settings {
    client_port: Arc<rustls::ServerConfig>,
    peer_port: Arc<rustls::ServerConfig>,
    http: Arc<rustls::ServerConfig>,
    peer_dial: Arc<rustls::ClientConfig>,
}

impl Settings {
    fn load(paths: &TlsPaths) -> Result<Settings, TlsError> {
        let chain = certificates(&paths.cert, &read(&paths.cert)?)?;
        let ca = certificates(&paths.ca, &read(&paths.ca)?)?;
        let key = PrivateKeyDer::from_pem_slice(&read(&paths.key)?)
            .map_err(|error| invalid(&paths.key, format!("not a PEM private key: {error}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in ca {
            roots
                .add(cert)
                .map_err(|error| invalid(&paths.ca, format!("not a usable CA: {error}")))?;
        }
        let roots = Arc::new(roots);
        let server = |verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
                      alpn: &[u8]| {
            let builder = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|error| invalid(&paths.cert, error))?;
            let builder = match verifier {
                Some(verifier) => builder.with_client_cert_verifier(verifier),
                None => builder.with_no_client_auth(),
            };
            let mut config = builder
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(|error| {
                    invalid(
                        &paths.cert,
                        format!("with {}: {error}", paths.key.display()),
                    )
                })?;
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok::<_, TlsError>(Arc::new(config))
        };
        let verifier = |optional: bool| {
            let builder = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.clone(),
                provider(),
            );
            let builder = if optional {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder.build().map_err(|error| invalid(&paths.ca, error))
        };
        let mut peer_dial = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| invalid(&paths.cert, error))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|error| {
                invalid(
                    &paths.cert,
                    format!("with {}: {error}", paths.key.display()),
                )
            })?;
        peer_dial.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Settings {
            client_port: server(Some(verifier(true)?), ALPN_H2)?,
            peer_port: server(Some(verifier(false)?), ALPN_H2)?,
            http: server(None, ALPN_HTTP1)?,
            peer_dial: Arc::new(peer_dial),
        })
    }
}

/// A node's TLS: where its files are and the settings last read from
/// them. Cheap to clone; clones share the settings, so a reload through
/// one is seen by all.
#[derive(Clone)]
pub struct NodeTls {
    paths: TlsPaths,
    current: Arc<RwLock<Arc<Settings>>>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("paths", &self.paths)
            .finish()
    }
}

/// Which of a node's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The client port: a client certificate is optional (a token may
    /// stand in), but must be of the cluster CA when shown.
    Client,
    /// The peer port: mutual TLS, certificates of the cluster CA only.
    Peer,
    /// The HTTP/JSON API: HTTPS, no client certificates (tokens only).
    Http,
}

impl NodeTls {
    /// Reads and checks the files: the certificates must parse, the key
    /// must be one and go with the certificate.
    pub fn load(paths: &TlsPaths) -> Result<NodeTls, TlsError> {
        let settings = Settings::load(paths)?;
        Ok(NodeTls {
            paths: paths.clone(),
            current: Arc::new(RwLock::new(Arc::new(settings))),
        })
    }

    /// Reads the files again; on success new connections use them, on
    /// failure nothing changes (the error says why).
    pub fn reload(&self) -> Result<(), TlsError> {
        let settings = Settings::load(&self.paths)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(settings);
        Ok(())
    }

    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    fn settings(&self) -> Arc<Settings> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current server settings of `port`.
    pub fn server_config(&self, port: Port) -> Arc<rustls::ServerConfig> {
        let settings = self.settings();
        match port {
            Port::Client => settings.client_port.clone(),
            Port::Peer => settings.peer_port.clone(),
            Port::Http => settings.http.clone(),
        }
    }

    /// The connections accepted on `listener`, each after a TLS handshake
    /// with the settings of `port` current when it arrived (handshakes run
    /// side by side; one that fails or takes longer than
    /// [`HANDSHAKE_TIMEOUT`] drops its connection). For tonic's
    /// `serve_with_incoming*`: a connection's certificates reach the
    /// services as tonic's `TlsConnectInfo`, as with tonic's own TLS.
    /// Accepting stops when the stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
        port: Port,
        gate: Option<Arc<Gate>>,
    ) -> impl Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<Admitted<TcpStream>>>>
    + Send
    + 'static {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let tls = self.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = sender.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let stream = match accepted {
                    // Counted from the accept, so a handshake holds a place.
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        match &gate {
                            None => Admitted::ungated(stream),
                            Some(gate) => match gate.admit(stream, peer.ip()) {
                                Some(admitted) => admitted,
                                None => continue,
                            },
                        }
                    }
                    Err(error) => {
                        // Out of descriptors, say: pause rather than spin.
                        tracing::warn!(%error, ?port, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config(port));
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send(Ok(stream)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, ?port, "TLS handshake failed"),
                        Err(_) => tracing::debug!(?port, "TLS handshake timed out"),
                    }
                });
            }
        });
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        })
    }

    /// A channel to node `target` at `endpoint` (an `http://` endpoint of
    /// the address to dial): every connection it opens handshakes with the
    /// settings current then, shows this node's certificate and requires
    /// one of the cluster CA naming `node-<target>` — whatever address is
    /// dialled (an announced address, or a `--peer-via` proxy).
    pub fn peer_channel(&self, endpoint: Endpoint, dial: &str, target: NodeId) -> Channel {
        let tls = self.clone();
        let dial = dial.to_string();
        let connector = tower::service_fn(move |_: http::Uri| {
            let tls = tls.clone();
            let dial = dial.clone();
            async move {
                let stream = TcpStream::connect(dial.as_str()).await?;
                let _ = stream.set_nodelay(true);
                let name = ServerName::try_from(node_name(target))
                    .map_err(|error| std::io::Error::other(error.to_string()))?;
                let connector = tokio_rustls::TlsConnector::from(tls.settings().peer_dial.clone());
                let stream =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, stream))
                        .await
                        .map_err(|_| std::io::Error::other("TLS handshake timed out"))??;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        endpoint.connect_with_connector_lazy(connector)
    }
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

    /// Writes a CA and a node certificate signed by it into `dir`.
    fn issue(dir: &Path, node: NodeId) -> TlsPaths {
        let mut ca_params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let params = rcgen::CertificateParams::new(vec![node_name(node)]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let paths = TlsPaths {
            cert: dir.join("node.pem"),
            key: dir.join("node-key.pem"),
            ca: dir.join("ca.pem"),
        };
        std::fs::write(&paths.cert, cert.pem()).unwrap();
        std::fs::write(&paths.key, key.serialize_pem()).unwrap();
        std::fs::write(&paths.ca, ca_cert.pem()).unwrap();
        paths
    }

    /// A reload that cannot use the new files (a bad key, a key of another
    /// certificate, a missing CA) changes nothing; one that can replaces
    /// the settings every port takes for its next connection.
    #[test]
    fn reload_replaces_the_settings_only_when_the_files_are_good() {
        let dir = tempfile::tempdir().unwrap();
        let paths = issue(dir.path(), 1);
        let tls = NodeTls::load(&paths).expect("good files load");
        let shared = tls.clone();
        let first = tls.server_config(Port::Client);
        let good_key = std::fs::read(&paths.key).unwrap();

        std::fs::write(&paths.key, "not a key").unwrap();
        assert!(matches!(tls.reload(), Err(TlsError::Invalid { .. })));
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let other_paths = issue(&other, 1);
        std::fs::copy(&other_paths.key, &paths.key).unwrap();
        assert!(
            tls.reload().is_err(),
            "a key that does not go with the certificate"
        );
        std::fs::write(&paths.key, &good_key).unwrap();
        std::fs::remove_file(&paths.ca).unwrap();
        assert!(matches!(tls.reload(), Err(TlsError::Read { .. })));
        for port in [Port::Client, Port::Peer, Port::Http] {
            let _ = tls.server_config(port);
        }
        assert!(Arc::ptr_eq(&first, &shared.server_config(Port::Client)));

        let renewed = issue(dir.path(), 1);
        tls.reload().expect("good new files load");
        assert!(!Arc::ptr_eq(&first, &shared.server_config(Port::Client)));
        assert_eq!(shared.paths().cert, renewed.cert);
    }
}
