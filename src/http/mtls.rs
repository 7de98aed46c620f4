//! Client certificates at the edge (pingora glue): the TLS handshake callback that
//! reads the names of the certificate the listener just verified and attaches them
//! to the connection, and the lookup of those names for a request. Which names count
//! and what they may do is `tofu::certificate`'s; the chain and validity period are
//! checked by rustls during the handshake (`server.rs` builds the verifier), so a
//! certificate that reaches here is one the configured CA issued and that is valid now.

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
        let identity = ClientIdentity::from_der(leaf)?;
        Some(Arc::new(identity))
    }
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
