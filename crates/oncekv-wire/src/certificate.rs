//! The one rule for the name a verified client certificate gives its
//! holder: the node's principal (client API, HTTP API) and the proxy's
//! caller both come from it, so a certificate names the same holder
//! everywhere. The subject's first common name, else (no common name at
//! all) its first DNS name. It reads the certificate only: whether it
//! chains to a trusted CA is the TLS layer's business, done before, and
//! what the name may do (a role, a scope) the caller's.

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

/// The holder a certificate (DER) names (see the module doc): at most
/// `max_bytes` bytes, not empty, without spaces or control characters.
pub fn holder_name(der: &[u8], max_bytes: usize) -> Result<String, NameError> {
    let (_, certificate) = X509Certificate::from_der(der).map_err(|_| NameError::Unparsable)?;
    let name = match certificate.subject().iter_common_name().next() {
        Some(common_name) => common_name
            .as_str()
            .map_err(|_| NameError::CommonNameNotText)?
            .to_owned(),
        None => certificate
            .subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|names| {
                names
                    .value
                    .general_names
                    .iter()
                    .find_map(|name| match name {
                        GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                        _ => None,
                    })
            })
            .ok_or(NameError::Nameless)?,
    };
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
