//! Client certificates at the edge (pingora glue): the TLS handshake callback that
//! reads the names of the certificate the listener just verified and attaches them
//! to the connection, and the lookup of those names for a request. Which names count
//! and what they may do is `tofu::certificate`'s; the chain and validity period are
//! checked by rustls during the handshake (`server.rs` builds the verifier), so a
//! certificate that reaches here is one the configured CA issued.
//!
//! TLS session resumption: rustls (as pingora sets it up: a 256-entry in-memory session
//! cache, TLS 1.2 session ids and TLS 1.3 tickets naming it) restores the client
//! certificate chain of the full handshake on a resumed session without verifying it
//! again, so the names read here are those of the certificate that was verified. What
//! could change in between is only time: the verifier and the revocation lists are
//! fixed for the life of the process (and the cache dies with it), but the
//! certificate may have expired since. So every handshake, full or resumed, checks the
//! validity period of each certificate of the chain again here; an expired one gives
//! the connection no identity (the same 401 as no certificate).

use std::any::Any;
use std::sync::Arc;

use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::proxy::Session;

use crate::tofu::certificate::ClientIdentity;

/// The handshake callback of a listener with `tls.client_ca`.
pub struct VerifiedClientNames;

#[async_trait::async_trait]
impl TlsAccept for VerifiedClientNames {
    async fn handshake_complete_callback(
        &self,
        tls: &TlsRef,
    ) -> Option<Arc<dyn Any + Send + Sync>> {
        // Only a certificate rustls verified is here (an unverified one ends the
        // handshake); none at all is allowed unless `tls.client_cert_required`.
        let leaf = tls.peer_certificate_der()?;
        let chain = tls.peer_cert_chain_der()?;
        if !chain.iter().all(|cert| valid_now(cert)) {
            tracing::info!("a client certificate outside its validity period (a resumed TLS session) is not used");
            return None;
        }
        let identity = ClientIdentity::from_der(leaf)?;
        Some(Arc::new(identity))
    }
}

/// Is a certificate (DER) within its validity period now? Unparsable: no.
fn valid_now(der: &[u8]) -> bool {
    x509_parser::parse_x509_certificate(der).is_ok_and(|(_, cert)| cert.validity().is_valid())
}

/// The verified client certificate's identity on this request's connection, if any.
pub fn client_identity(session: &Session) -> Option<&ClientIdentity> {
    session
        .digest()?
        .ssl_digest
        .as_ref()?
        .extension
        .get::<ClientIdentity>()
}
