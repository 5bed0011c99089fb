//! The upstream: where requests go (`--upstream http://HOST:PORT[/PREFIX]`),
//! one pooled HTTP/1.1 client to it, the request's URI rewritten onto it,
//! and the headers a proxy must not pass on (hop-by-hop ones, and the
//! proxy's own `Idempotency-Fence` / `Idempotency-Attempt`, which only the
//! proxy sets). It decides nothing about keys or records.

use crate::body::ProxyBody;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

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

/// The upstream service and the client that calls it.
#[derive(Clone, Debug)]
pub struct Upstream {
    scheme: Scheme,
    authority: Authority,
    /// A path prefix every request's path goes under (no trailing `/`;
    /// empty for none).
    prefix: String,
    client: HttpClient<HttpConnector, ProxyBody>,
}

impl Upstream {
    /// The upstream at `url`: `http://HOST:PORT` with an optional path
    /// prefix (no query). HTTPS to the upstream is not supported: the
    /// proxy is a sidecar beside it.
    pub fn new(url: &str) -> Result<Upstream, UpstreamError> {
        let error = |why: &str| UpstreamError {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| error("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(error(
                    "https is not supported; the proxy talks plain HTTP to an upstream beside it",
                ));
            }
            _ => return Err(error("give http://HOST:PORT")),
        }
        let authority = uri.authority().cloned().ok_or_else(|| error("no host"))?;
        if uri.query().is_some() {
            return Err(error("a query is not allowed"));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Upstream {
            scheme: Scheme::HTTP,
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

    /// Sends `request` (its URI already [`Upstream::uri_for`]'s).
    pub async fn send(
        &self,
        request: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, hyper_util::client::legacy::Error> {
        self.client.request(request).await
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

    /// Paths and queries go under the prefix unchanged; https and queries
    /// in the upstream URL are refused.
    #[tokio::test]
    async fn uris_are_rewritten_onto_the_upstream() {
        let plain = Upstream::new("http://127.0.0.1:9000").unwrap();
        let uri: Uri = "/orders/4%2F2?x=1&y".parse().unwrap();
        assert_eq!(
            plain.uri_for(&uri).unwrap().to_string(),
            "http://127.0.0.1:9000/orders/4%2F2?x=1&y"
        );
        let prefixed = Upstream::new("http://app:80/api/").unwrap();
        assert_eq!(
            prefixed.uri_for(&uri).unwrap().to_string(),
            "http://app:80/api/orders/4%2F2?x=1&y"
        );
        for bad in ["https://a:1", "a:1", "http://a:1/?q", "ftp://a"] {
            assert!(Upstream::new(bad).is_err(), "{bad}");
        }
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
