//! Talking to a node's HTTP/JSON API in tests: one HTTP/1.1 request per
//! connection (`Connection: close`) over loopback TCP, or TLS trusting the
//! cluster CA, and the response's status, headers and JSON body; or an open
//! connection ([`Http::connect`]) for a test that writes at its own pace,
//! from a chosen loopback address ([`Http::connecting_from`]).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::rustls;

/// Deadline of one request: above the node's own deadline for a
/// forwarded call (10 s), so the node's answer is what a test sees.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// A response as received.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as JSON; panics (showing it) if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "a non-JSON body ({error}) with status {}: {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A connection to the API, plain or TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// The HTTP API of one node.
#[derive(Clone)]
pub struct Http {
    addr: String,
    tls: Option<tokio_rustls::TlsConnector>,
    /// The local address connections come from; `None`: the system's choice.
    source: Option<IpAddr>,
}

impl Http {
    /// Plain HTTP to `addr` (`127.0.0.1:port`).
    pub fn plain(addr: &str) -> Http {
        Http {
            addr: addr.to_string(),
            tls: None,
            source: None,
        }
    }

    /// The same API, with connections from `source` (another loopback
    /// address, such as 127.0.0.2, is another peer to the node).
    pub fn connecting_from(&self, source: IpAddr) -> Http {
        Http {
            source: Some(source),
            ..self.clone()
        }
    }

    /// HTTPS to `addr`, trusting the CA in the PEM file `ca`.
    pub fn tls(addr: &str, ca: &Path) -> Http {
        Http::tls_with(addr, ca, None)
    }

    /// HTTPS to `addr`, trusting `ca`, presenting the client certificate
    /// in the PEM file `cert` with its key `key`.
    pub fn tls_as(addr: &str, ca: &Path, cert: &Path, key: &Path) -> Http {
        Http::tls_with(addr, ca, Some((cert, key)))
    }

    fn tls_with(addr: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Http {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(ca).expect("read the CA"))
            .expect("add the CA");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
        let config = match identity {
            None => config.with_no_client_auth(),
            Some((cert, key)) => {
                use rustls::pki_types::PrivateKeyDer;
                let chain = CertificateDer::pem_file_iter(cert)
                    .expect("read the client certificate")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("parse the client certificate");
                let key = PrivateKeyDer::from_pem_file(key).expect("read the client key");
                config
                    .with_client_auth_cert(chain, key)
                    .expect("a client identity")
            }
        };
        Http {
            addr: addr.to_string(),
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(config))),
            source: None,
        }
    }

    /// Sends `method path` with `headers` and `body` (a Content-Length
    /// body); the response, or why none came within [`REQUEST_TIMEOUT`].
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        self.raw(&bytes).await
    }

    /// Sends the JSON `body`.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: serde_json::Value,
    ) -> Result<Response, String> {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        self.request(method, path, &all, body.to_string().as_bytes())
            .await
    }

    /// Writes `bytes` as they are and reads the response.
    pub async fn raw(&self, bytes: &[u8]) -> Result<Response, String> {
        let work = async {
            let stream = self.connect().await?;
            exchange(stream, bytes).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, work)
            .await
            .map_err(|_| format!("no response from {} within {REQUEST_TIMEOUT:?}", self.addr))?
    }

    /// An open connection (the TLS handshake done, if TLS), nothing sent.
    pub async fn connect(&self) -> Result<Box<dyn Stream>, String> {
        let addr: std::net::SocketAddr = self
            .addr
            .parse()
            .map_err(|error| format!("address {}: {error}", self.addr))?;
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .map_err(|error| format!("socket: {error}"))?;
        if let Some(source) = self.source {
            socket
                .bind((source, 0).into())
                .map_err(|error| format!("bind {source}: {error}"))?;
        }
        let stream = socket
            .connect(addr)
            .await
            .map_err(|error| format!("connect {}: {error}", self.addr))?;
        match &self.tls {
            None => Ok(Box::new(stream)),
            Some(connector) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
                    .expect("an IP address is a server name");
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|error| format!("TLS handshake with {}: {error}", self.addr))?;
                Ok(Box::new(stream))
            }
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    bytes: &[u8],
) -> Result<Response, String> {
    send(&mut stream, bytes).await?;
    read_response(&mut stream).await
}

/// Writes `bytes` and flushes them (through TLS, when the stream has it).
pub async fn send<W: AsyncWrite + Unpin>(writer: &mut W, bytes: &[u8]) -> Result<(), String> {
    writer
        .write_all(bytes)
        .await
        .map_err(|error| format!("send: {error}"))?;
    writer
        .flush()
        .await
        .map_err(|error| format!("send: {error}"))
}

/// Reads one response (a head, then exactly Content-Length bytes of body).
pub async fn read_response<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Response, String> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 16 << 10];
    // The head first, then exactly Content-Length bytes of body.
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|window| window == b"\r\n\r\n") {
            break at;
        }
        let read = stream
            .read(&mut buffer)
            .await
            .map_err(|error| format!("receive: {error}"))?;
        if read == 0 {
            return Err(format!(
                "the connection closed before a response head: {:?}",
                String::from_utf8_lossy(&received)
            ));
        }
        received.extend_from_slice(&buffer[..read]);
    };
    let head = String::from_utf8(received[..head_end].to_vec()).map_err(|_| "a non-UTF-8 head")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("a bad status line: {head:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .ok_or_else(|| format!("a response without Content-Length: {head:?}"))?;
    let mut body = received[head_end + 4..].to_vec();
    while body.len() < length {
        let read = stream
            .read(&mut buffer)
            .await
            .map_err(|error| format!("receive the body: {error}"))?;
        if read == 0 {
            return Err("the connection closed inside the body".into());
        }
        body.extend_from_slice(&buffer[..read]);
    }
    body.truncate(length);
    Ok(Response {
        status,
        headers,
        body,
    })
}
