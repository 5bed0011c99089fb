//! The upstream: where requests go (`--upstream http[s]://HOST:PORT[/PREFIX]`),
//! one pooled HTTP/1.1 client to it — over TLS for `https`, the upstream's
//! certificate checked against `--upstream-ca` or the platform's roots and
//! the URL's host, with an optional client certificate —, the request's URI
//! rewritten onto it, and the headers a proxy must not pass on (hop-by-hop
//! ones, and the proxy's own `Idempotency-Fence` / `Idempotency-Attempt`,
//! which only the proxy sets). It decides nothing about keys or records.

use crate::body::ProxyBody;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ClientConfig, ConfigBuilder, RootCertStore, WantsVerifier, crypto};

/// Header carrying the claim's fencing token to the upstream.
pub const IDEMPOTENCY_FENCE: HeaderName = HeaderName::from_static("idempotency-fence");
/// Header carrying the claim's attempt (1, then 2 after a takeover...).
pub const IDEMPOTENCY_ATTEMPT: HeaderName = HeaderName::from_static("idempotency-attempt");

/// Why an `--upstream` is not usable.
#[derive(Debug, thiserror::Error)]
#[error("--upstream {url:?}: {why}")]
pub struct UpstreamError {
    url: String,
    why: String,
}

/// How the proxy talks TLS to an `https` upstream (`--upstream-ca`,
/// `--upstream-cert`, `--upstream-key`), as PEM text. Without a CA the
/// platform's roots are trusted; without an identity the proxy presents
/// no certificate. An `http` upstream takes none of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// CA certificates the upstream's certificate must chain to.
    pub ca_pem: Option<Vec<u8>>,
    /// The proxy's certificate chain and its private key, for an upstream
    /// that asks for client certificates (mutual TLS).
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl UpstreamTls {
    fn is_empty(&self) -> bool {
        self.ca_pem.is_none() && self.identity_pem.is_none()
    }

    /// The rustls client configuration: roots, then the identity, if any.
    fn client_config(&self) -> Result<ClientConfig, String> {
        let roots = match &self.ca_pem {
            Some(pem) => trusted_roots(pem, "--upstream-ca")?,
            None => {
                let mut roots = RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(format!(
                        "no trusted root certificate found on this machine ({} errors reading them); give --upstream-ca",
                        found.errors.len()
                    ));
                }
                roots
            }
        };
        let builder = tls_builder()?.with_root_certificates(roots);
        match &self.identity_pem {
            None => Ok(builder.with_no_client_auth()),
            Some((chain_pem, key_pem)) => {
                let chain = CertificateDer::pem_slice_iter(chain_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| format!("--upstream-cert: not PEM certificates: {error}"))?;
                if chain.is_empty() {
                    return Err("--upstream-cert: no certificate in it".to_owned());
                }
                let key = PrivateKeyDer::from_pem_slice(key_pem)
                    .map_err(|error| format!("--upstream-key: no PEM private key: {error}"))?;
                builder.with_client_auth_cert(chain, key).map_err(|error| {
                    format!("--upstream-cert and --upstream-key do not make an identity: {error}")
                })
            }
        }
    }
}

/// The CA certificates in `pem` as a root store; why not, said as `what`'s
/// (a flag, say): not PEM, none in it, or one rustls refuses. The
/// upstream's `--upstream-ca` and the listener's `--callers-ca` both.
pub(crate) fn trusted_roots(pem: &[u8], what: &str) -> Result<RootCertStore, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{what}: not PEM certificates: {error}"))?;
    if certificates.is_empty() {
        return Err(format!("{what}: no certificate in it"));
    }
    let mut roots = RootCertStore::empty();
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|error| format!("{what}: a certificate rustls refuses: {error}"))?;
    }
    Ok(roots)
}

/// A rustls client configuration's start: ring (as the rest of the tree),
/// the safe default protocol versions.
fn tls_builder() -> Result<ConfigBuilder<ClientConfig, WantsVerifier>, String> {
    ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS versions: {error}"))
}

/// The upstream service and the client that calls it.
#[derive(Clone, Debug)]
pub struct Upstream {
    scheme: Scheme,
    authority: Authority,
    /// A path prefix every request's path goes under (no trailing `/`;
    /// empty for none).
    prefix: String,
    client: HttpClient<HttpsConnector<HttpConnector>, ProxyBody>,
}

impl Upstream {
    /// The upstream at `url`: `http://HOST:PORT` or `https://HOST[:PORT]`
    /// with an optional path prefix (no query). For `https`, `tls` says
    /// what to trust and what to present; the upstream's certificate must
    /// name the URL's host.
    pub fn new(url: &str, tls: &UpstreamTls) -> Result<Upstream, UpstreamError> {
        let error = |why: &str| UpstreamError {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| error("not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::HTTP,
            Some("https") => Scheme::HTTPS,
            _ => return Err(error("give http://HOST:PORT or https://HOST:PORT")),
        };
        let authority = uri.authority().cloned().ok_or_else(|| error("no host"))?;
        if uri.query().is_some() {
            return Err(error("a query is not allowed"));
        }
        if scheme == Scheme::HTTP && !tls.is_empty() {
            return Err(error(
                "--upstream-ca, --upstream-cert and --upstream-key need an https upstream",
            ));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        // The TLS layer below decides the scheme: plain TCP for http, a
        // handshake first for https.
        connector.enforce_http(false);
        let connector = if scheme == Scheme::HTTPS {
            HttpsConnectorBuilder::new()
                .with_tls_config(tls.client_config().map_err(|why| error(&why))?)
                .https_only()
                .enable_http1()
                .wrap_connector(connector)
        } else {
            // Every URI this client sees is http: the TLS configuration
            // (trusting nothing) is never used.
            HttpsConnectorBuilder::new()
                .with_tls_config(
                    tls_builder()
                        .map_err(|why| error(&why))?
                        .with_root_certificates(RootCertStore::empty())
                        .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector)
        };
        let client = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Upstream {
            scheme,
            authority,
            prefix,
            client,
        })
    }

    /// The upstream's URI for a request to `original`: its path (under
    /// the prefix) and query, unchanged.
    pub fn uri_for(&self, original: &Uri) -> Result<Uri, http::Error> {
        let path_and_query = original.path_and_query().map_or("/", PathAndQuery::as_str);
        let path_and_query = if self.prefix.is_empty() {
            PathAndQuery::try_from(path_and_query)?
        } else {
            PathAndQuery::try_from(format!("{}{path_and_query}", self.prefix))?
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }

    /// Sends `request` (its URI already [`Upstream::uri_for`]'s). The
    /// response comes back as HTTP/1.1 whatever version the upstream
    /// spoke: a message's version belongs to its connection (RFC 9110
    /// §6.2), and the caller's connection is the proxy's, HTTP/1.1 — a
    /// forwarded answer says so as its replays do.
    pub async fn send(
        &self,
        request: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, hyper_util::client::legacy::Error> {
        let mut response = self.client.request(request).await?;
        *response.version_mut() = http::Version::HTTP_11;
        Ok(response)
    }

    /// `http://HOST:PORT/PREFIX`, for messages.
    pub fn describe(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.prefix)
    }
}

/// Removes the hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the
/// headers it names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
/// `Transfer-Encoding`, `Upgrade`), which belong to one connection, not
/// to the message a proxy passes on.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        // The caller's credential for this proxy (`--callers-file`), never
        // the upstream's.
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths and queries go under the prefix unchanged; queries and other
    /// schemes in the upstream URL are refused, and so is TLS material for
    /// a plain upstream.
    #[tokio::test]
    async fn uris_are_rewritten_onto_the_upstream() {
        let none = UpstreamTls::default();
        let plain = Upstream::new("http://127.0.0.1:9000", &none).unwrap();
        let uri: Uri = "/orders/4%2F2?x=1&y".parse().unwrap();
        assert_eq!(
            plain.uri_for(&uri).unwrap().to_string(),
            "http://127.0.0.1:9000/orders/4%2F2?x=1&y"
        );
        let prefixed = Upstream::new("http://app:80/api/", &none).unwrap();
        assert_eq!(
            prefixed.uri_for(&uri).unwrap().to_string(),
            "http://app:80/api/orders/4%2F2?x=1&y"
        );
        for bad in ["a:1", "http://a:1/?q", "ftp://a"] {
            assert!(Upstream::new(bad, &none).is_err(), "{bad}");
        }
        let with_ca = UpstreamTls {
            ca_pem: Some(b"not pem".to_vec()),
            identity_pem: None,
        };
        let refused = Upstream::new("http://a:1", &with_ca).unwrap_err();
        assert!(
            refused.to_string().contains("need an https upstream"),
            "{refused}"
        );
        let refused = Upstream::new("https://a:1", &with_ca).unwrap_err();
        assert!(refused.to_string().contains("--upstream-ca"), "{refused}");
    }

    /// An HTTP/1.0 upstream's answer comes back as HTTP/1.1, the version
    /// of the caller's connection.
    #[tokio::test]
    async fn an_answer_takes_the_callers_http_version() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 4096];
            let _ = stream.read(&mut request).await.unwrap();
            stream
                .write_all(b"HTTP/1.0 201 Created\r\nContent-Length: 2\r\n\r\nok")
                .await
                .unwrap();
        });
        let upstream = Upstream::new(&format!("http://{addr}"), &UpstreamTls::default()).unwrap();
        let mut request = http::Request::new(crate::body::full("x"));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = upstream.uri_for(&"/orders".parse().unwrap()).unwrap();
        let response = upstream.send(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::CREATED);
        assert_eq!(response.version(), http::Version::HTTP_11);
        server.await.unwrap();
    }

    /// Hop-by-hop headers, and those `Connection` names, are dropped.
    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "keep-alive, x-secret".parse().unwrap());
        headers.insert("x-secret", "1".parse().unwrap());
        headers.insert("transfer-encoding", "chunked".parse().unwrap());
        headers.insert("content-type", "text/plain".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("content-type"));
    }
}
