//! The names a certificate carries (`cert_names`: the node's peer port
//! checks a peer's claim against them), and the one rule for the name a
//! verified client certificate gives its holder (`holder_name`): the
//! node's principal (client API, HTTP API) and the proxy's caller both
//! come from it, so a certificate names the same holder everywhere. The
//! subject's first common name, else (no common name at all) its first DNS
//! name. It reads the certificate only: whether it chains to a trusted CA
//! is the TLS layer's business, done before, and what the name may do (a
//! role, a scope) the caller's.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Why a certificate names no holder.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the client certificate does not parse")]
    Unparsable,
    /// A first common name that is not text: refused, not skipped for a
    /// later name (that one could name someone else).
    #[error("the client certificate's common name is not text")]
    CommonNameNotText,
    #[error("the client certificate names no holder (no common name, no DNS name)")]
    Nameless,
    #[error(
        "the client certificate's name is not a holder's name (1 to {max_bytes} bytes, no spaces or control characters)"
    )]
    NotAName { max_bytes: usize },
}

/// The names a certificate carries: its subject's first common name and
/// its DNS subject alternative names (IP addresses name nobody).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertNames {
    /// The first common name, if it is text.
    pub common_name: Option<String>,
    /// The first common name is there but is not text.
    pub common_name_not_text: bool,
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
    let (_, certificate) = X509Certificate::from_der(der).ok()?;
    let first_common_name = certificate
        .subject()
        .iter_common_name()
        .next()
        .map(|common_name| common_name.as_str().map(str::to_owned));
    let dns_names = certificate
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|names| {
            names
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(CertNames {
        common_name_not_text: first_common_name.as_ref().is_some_and(Result::is_err),
        common_name: first_common_name.and_then(Result::ok),
        dns_names,
    })
}

/// The holder a certificate (DER) names (see the module doc): at most
/// `max_bytes` bytes, not empty, without spaces or control characters.
pub fn holder_name(der: &[u8], max_bytes: usize) -> Result<String, NameError> {
    let names = cert_names(der).ok_or(NameError::Unparsable)?;
    if names.common_name_not_text {
        return Err(NameError::CommonNameNotText);
    }
    let name = names
        .common_name
        .or_else(|| names.dns_names.into_iter().next())
        .ok_or(NameError::Nameless)?;
    if name.is_empty()
        || name.len() > max_bytes
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(NameError::NotAName { max_bytes });
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_no_certificate_name_nobody() {
        assert_eq!(
            holder_name(b"not a certificate", 64),
            Err(NameError::Unparsable)
        );
    }
}
