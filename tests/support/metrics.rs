//! Reading a node's Prometheus endpoint in tests: one plain HTTP/1.1 GET
//! over a loopback TCP connection (or HTTPS trusting the cluster CA, for a
//! node with TLS), and lookups of samples by name and labels in the text
//! exposition.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET /metrics` from `addr`; the body, or why there is none.
pub async fn scrape(addr: &str, timeout: Duration) -> Result<String, String> {
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|error| format!("connect {addr}: {error}"))?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|error| format!("send to {addr}: {error}"))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|error| format!("read from {addr}: {error}"))?;
        let response = String::from_utf8(response).map_err(|_| "a non-UTF-8 response")?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or("a response without a header end")?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("not 200: {head}"));
        }
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Err("a chunked response (the test reader wants Content-Length)".into());
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("no metrics from {addr} within {timeout:?}"))?
}

/// `GET /metrics` from `addr` over HTTPS, trusting the CA in the PEM file
/// `ca`; the body, or why there is none.
pub async fn scrape_tls(
    addr: &str,
    ca: &std::path::Path,
    timeout: Duration,
) -> Result<String, String> {
    let http = super::http::Http::tls(addr, ca);
    let work = http.request("GET", "/metrics", &[], b"");
    let response = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("no metrics from {addr} within {timeout:?}"))??;
    if response.status != 200 {
        return Err(format!("not 200: {}", response.status));
    }
    String::from_utf8(response.body).map_err(|_| "a non-UTF-8 response".into())
}

/// The value of the sample `name{labels}` (labels in any order; the sample
/// may carry more labels than asked for); `None` when absent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, series_labels) = match series.split_once('{') {
                Some((series_name, rest)) => (series_name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if series_name != name {
                return None;
            }
            let all_match = labels.iter().all(|(key, wanted)| {
                series_labels.split(',').any(|pair| {
                    pair.split_once('=')
                        .is_some_and(|(k, v)| k == *key && v.trim_matches('"') == *wanted)
                })
            });
            if all_match { value.parse().ok() } else { None }
        })
}

/// Like [`sample`], 0 when absent (a counter not yet incremented).
pub fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or(0.0)
}

/// The labels of the first sample named `name`, as (key, value) pairs.
pub fn labels_of(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, _) = rest.split_once('}')?;
        Some(
            labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect(),
        )
    })
}
