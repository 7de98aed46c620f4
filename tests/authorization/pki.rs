//! Real key material for the authorization property's client certificates and CI
//! issuer: a CA and the certificates it issues (X.509 v3, P-256 ECDSA, made with
//! `x509-cert`'s builder), and ES256 signatures as a JWT issuer makes them. Nothing here
//! is a stand-in: rustls verifies these certificates in a real handshake, and
//! stategate checks the tokens against the issuer's JWKS fetched over HTTPS.

use std::sync::Arc;
use std::time::Duration;

use p256::ecdsa::signature::Signer;
use p256::ecdsa::{DerSignature, Signature, SigningKey};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::asn1::{Ia5String, OctetString};
use x509_cert::der::{Encode, EncodePem};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// A fresh P-256 key from the operating system's random source.
pub fn new_key() -> SigningKey {
    loop {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).expect("random bytes");
        // Out of range (zero or above the group order) is astronomically rare: draw again.
        if let Ok(key) = SigningKey::from_slice(&bytes) {
            return key;
        }
    }
}

/// A certificate and its key, as PEM and DER.
pub struct Issued {
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key_pem: String,
    pub key_der: Vec<u8>,
}

impl Issued {
    /// The pair as rustls takes it (a client's identity, a server's certificate).
    pub fn rustls(
        &self,
    ) -> (
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        (
            vec![rustls::pki_types::CertificateDer::from(
                self.cert_der.clone(),
            )],
            rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
        )
    }
}

/// A certificate authority of its own.
pub struct Ca {
    key: SigningKey,
    name: Name,
    pub pem: String,
    pub der: Vec<u8>,
}

fn spki(key: &SigningKey) -> SubjectPublicKeyInfoOwned {
    SubjectPublicKeyInfoOwned::from_key(*key.verifying_key()).expect("a P-256 public key")
}

fn day() -> Validity {
    Validity::from_now(Duration::from_secs(24 * 3600)).expect("a validity period")
}

impl Ca {
    pub fn new(common_name: &str) -> Ca {
        let key = new_key();
        let name: Name = format!("CN={common_name}").parse().expect("a name");
        let builder = CertificateBuilder::new(
            Profile::Root,
            SerialNumber::from(1u32),
            day(),
            name.clone(),
            spki(&key),
            &key,
        )
        .expect("a CA certificate");
        let cert = builder.build::<DerSignature>().expect("signed");
        Ca {
            pem: cert.to_pem(LineEnding::LF).expect("PEM"),
            der: cert.to_der().expect("DER"),
            key,
            name,
        }
    }

    /// A leaf certificate named `common_name`, with DNS subject alternative names
    /// `dns` and, when `loopback`, the IP address 127.0.0.1 (a server's).
    pub fn issue(&self, serial: u32, common_name: &str, dns: &[&str], loopback: bool) -> Issued {
        let key = new_key();
        let subject: Name = format!("CN={common_name}").parse().expect("a name");
        let mut builder = CertificateBuilder::new(
            Profile::Leaf {
                issuer: self.name.clone(),
                enable_key_agreement: false,
                enable_key_encipherment: false,
            },
            SerialNumber::from(serial),
            day(),
            subject,
            spki(&key),
            &self.key,
        )
        .expect("a leaf certificate");
        let mut names: Vec<GeneralName> = dns
            .iter()
            .map(|n| GeneralName::DnsName(Ia5String::new(n).expect("an IA5 name")))
            .collect();
        if loopback {
            names.push(GeneralName::IpAddress(
                OctetString::new(vec![127, 0, 0, 1]).expect("an address"),
            ));
        }
        builder
            .add_extension(&SubjectAltName(names))
            .expect("a SAN extension");
        let cert = builder.build::<DerSignature>().expect("signed");
        Issued {
            cert_pem: cert.to_pem(LineEnding::LF).expect("PEM"),
            cert_der: cert.to_der().expect("DER"),
            key_pem: key.to_pkcs8_pem(LineEnding::LF).expect("PEM").to_string(),
            key_der: key.to_pkcs8_der().expect("DER").as_bytes().to_vec(),
        }
    }

    /// A rustls trust store holding only this CA.
    pub fn roots(&self) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(self.der.clone()))
            .expect("the CA");
        Arc::new(roots)
    }
}

/// The ring provider rustls is built with here (no process-wide default is assumed).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn b64(data: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(data)
}

/// A JWT issuer's signing key (ES256) and its JWK.
pub struct JwtKey {
    key: SigningKey,
    pub kid: String,
}

impl JwtKey {
    pub fn new(kid: &str) -> JwtKey {
        JwtKey {
            key: new_key(),
            kid: kid.into(),
        }
    }

    /// The public key as a JWKS entry.
    pub fn jwk(&self) -> serde_json::Value {
        let point = self.key.verifying_key().to_encoded_point(false);
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(point.x().expect("an uncompressed point")),
            "y": b64(point.y().expect("an uncompressed point")),
        })
    }

    /// `claims` signed as a compact JWS (ES256: the signature is r ‖ s).
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature: Signature = self.key.sign(signed.as_bytes());
        format!("{signed}.{}", b64(&signature.to_bytes()))
    }
}
