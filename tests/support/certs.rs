//! Certificates made in the test (rcgen): a CA, server certificates it
//! signs (valid or expired) for `localhost`, client certificates for mTLS,
//! and the rustls server configs of HTTPS receivers that use them.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    date_time_ymd,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate and its key, in PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-sign CA");
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1; `expired` makes
    /// one that ran out in 2020.
    pub fn server(&self, expired: bool) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = date_time_ymd(2019, 1, 1);
            params.not_after = date_time_ymd(2020, 1, 1);
        }
        self.sign(params)
    }

    /// A client certificate, for mTLS.
    pub fn client(&self, name: &str) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A server config presenting `leaf`; with `clients`, one that demands a
/// client certificate signed by that CA.
pub fn server_config(leaf: &Leaf, clients: Option<&TestCa>) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
        .collect::<Result<_, _>>()
        .expect("server chain");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("server key");
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                roots.add(cert.expect("CA pem")).expect("client CA");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).expect("server cert");
    // As most HTTPS servers: HTTP/2 for clients that offer it.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write PEM");
    path
}
