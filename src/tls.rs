//! TLS to an endpoint (docs/delivery.md "TLS to endpoints"): the system roots plus a
//! destination's `ca_file`, and its `client_cert`/`client_key` for mTLS.
//! Verification cannot be turned off: no key or code path does it.
//!
//! cert-manager and kubelet replace mounted certificate files in place (a
//! Secret volume swaps a symlink), so the files are not read once: each new
//! connection's handshake asks whether any of them changed (a `stat` of
//! each, at most once per [`RECHECK`]) and re-reads them if so. Files that
//! fail to load keep the last good ones in use and say why in the log.
//! Connections already open keep what they were made with, as any TLS
//! client does. Polling on the handshake rather than `notify`: inotify
//! watches the old inode and misses a symlink swap, and a handshake is
//! exactly when a change matters.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// How often a handshake may `stat` the files.
const RECHECK: Duration = Duration::from_secs(2);

/// A destination's `tls` files, as configured (absolute paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    /// `client_cert` and `client_key`, set together.
    pub client: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} is not valid PEM: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error("{}: a certificate cannot be used as a CA: {reason}", path.display())]
    BadCa { path: PathBuf, reason: String },
    #[error("{} holds no private key (PKCS#8, PKCS#1 or SEC1, in PEM)", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: the private key cannot be used: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("{}: the certificate cannot be used: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{} is not the key of the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("cannot configure TLS: {0}")]
    Setup(String),
}

impl TlsFileError {
    /// The file the error is about (for a mismatch, the key).
    pub fn path(&self) -> Option<&Path> {
        match self {
            TlsFileError::Read { path, .. }
            | TlsFileError::NoCertificate { path }
            | TlsFileError::Pem { path, .. }
            | TlsFileError::BadCa { path, .. }
            | TlsFileError::NoKey { path }
            | TlsFileError::BadKey { path, .. }
            | TlsFileError::BadCertificate { path, .. } => Some(path),
            TlsFileError::KeyMismatch { key, .. } => Some(key),
            TlsFileError::Setup(_) => None,
        }
    }
}

/// The provider every TLS connection uses: ring, no OpenSSL.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads every file as a connection would, so that `courier check` and a
/// reload refuse what a handshake would fail on.
pub fn check(files: &TlsFiles) -> Result<(), TlsFileError> {
    let provider = provider();
    if let Some(ca) = &files.ca_file {
        roots(&RootCertStore::empty(), ca)?;
    }
    if let Some((cert, key)) = &files.client {
        client_key(cert, key, &provider)?;
    }
    Ok(())
}

/// A client config for one destination: `system` roots plus `ca_file`,
/// and the client certificate when set, both re-read when they change.
pub fn client_config(
    system: &Arc<RootCertStore>,
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
) -> Result<ClientConfig, TlsFileError> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsFileError::Setup(e.to_string()))?;
    let builder = match &files.ca_file {
        None => builder.with_root_certificates(system.clone()),
        Some(ca) => {
            let (system, ca, provider) = (system.clone(), ca.clone(), provider.clone());
            let paths = vec![ca.clone()];
            let verifier = Watched::new(paths, move || verifier(&system, &ca, &provider))?;
            // "dangerous" only in name: the custom verifier is webpki's own,
            // rebuilt when the CA file changes.
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ReloadingRoots(verifier)))
        }
    };
    Ok(match &files.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let (c, k, p) = (cert.clone(), key.clone(), provider.clone());
            let watched = Watched::new(vec![cert.clone(), key.clone()], move || {
                client_key(&c, &k, &p)
            })?;
            builder.with_client_cert_resolver(Arc::new(ReloadingClientKey(watched)))
        }
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsFileError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn roots(system: &RootCertStore, ca_file: &Path) -> Result<Arc<RootCertStore>, TlsFileError> {
    let mut roots = system.clone();
    for cert in certificates(ca_file)? {
        roots.add(cert).map_err(|e| TlsFileError::BadCa {
            path: ca_file.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

fn verifier(
    system: &RootCertStore,
    ca_file: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsFileError> {
    WebPkiServerVerifier::builder_with_provider(roots(system, ca_file)?, provider.clone())
        .build()
        .map_err(|e| TlsFileError::BadCa {
            path: ca_file.to_path_buf(),
            reason: e.to_string(),
        })
}

fn client_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsFileError> {
    let chain = certificates(cert)?;
    let pem = read(key)?;
    let der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsFileError::NoKey {
            path: key.to_path_buf(),
        },
        e => TlsFileError::Pem {
            path: key.to_path_buf(),
            reason: e.to_string(),
        },
    })?;
    let signing =
        provider
            .key_provider
            .load_private_key(der)
            .map_err(|e| TlsFileError::BadKey {
                path: key.to_path_buf(),
                reason: e.to_string(),
            })?;
    if let Some(leaf) = chain.first() {
        parsed(cert, leaf)?;
    }
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsFileError::KeyMismatch {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
            })
        }
        Err(e) => Err(TlsFileError::BadKey {
            path: key.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Whether rustls can read the client certificate at `path`: it reads it to
/// check the key against it, and a certificate it cannot read fails that
/// check too, which would otherwise be reported as a wrong key.
fn parsed(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), TlsFileError> {
    let reason = match webpki::EndEntityCert::try_from(leaf) {
        Ok(_) => return Ok(()),
        Err(webpki::Error::UnsupportedCertVersion) => "it is an X.509 v1 certificate (one without extensions, as `openssl x509 -req` makes without -extfile), and rustls, courier's TLS library, reads only v3 ones: issue it again with an extension, e.g. `openssl x509 -req ... -extfile <(printf 'extendedKeyUsage=clientAuth')`".to_string(),
        Err(e) => format!("rustls cannot read it ({e})"),
    };
    Err(TlsFileError::BadCertificate {
        path: path.to_path_buf(),
        reason,
    })
}

/// What says a file changed: modification time, length and inode (a
/// swapped symlink points at another inode). `None`: cannot be read.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len(), m.ino()))
        })
        .collect()
}

type Load<T> = Box<dyn Fn() -> Result<T, TlsFileError> + Send + Sync>;

/// A value loaded from files, loaded again when they change.
struct Watched<T> {
    paths: Vec<PathBuf>,
    load: Load<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    checked: Instant,
    stamps: Vec<Stamp>,
    value: T,
}

impl<T: Clone> Watched<T> {
    fn new(
        paths: Vec<PathBuf>,
        load: impl Fn() -> Result<T, TlsFileError> + Send + Sync + 'static,
    ) -> Result<Self, TlsFileError> {
        let stamps = stamps(&paths);
        let value = load()?;
        Ok(Watched {
            paths,
            load: Box::new(load),
            state: Mutex::new(State {
                checked: Instant::now(),
                stamps,
                value,
            }),
        })
    }

    fn current(&self) -> T {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.checked.elapsed() >= RECHECK {
            s.checked = Instant::now();
            let now = stamps(&self.paths);
            if now != s.stamps {
                // Taken as seen either way: a failed load is retried when
                // the files change again (e.g. the key written after the
                // certificate), not on every handshake.
                s.stamps = now;
                match (self.load)() {
                    Ok(value) => {
                        s.value = value;
                        tracing::info!(files = ?self.paths, "TLS files changed: new connections use them");
                    }
                    Err(e) => {
                        tracing::warn!(files = ?self.paths, error = %e, "TLS files changed but cannot be used: new connections keep the previous ones");
                    }
                }
            }
        }
        s.value.clone()
    }
}

impl<T> fmt::Debug for Watched<T> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Watched")
            .field("paths", &self.paths)
            .finish()
    }
}

/// webpki's verifier over the system roots and the CA file as it is now.
#[derive(Debug)]
struct ReloadingRoots(Watched<Arc<WebPkiServerVerifier>>);

impl ServerCertVerifier for ReloadingRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().supported_verify_schemes()
    }
}

/// The client certificate and key as they are now.
#[derive(Debug)]
struct ReloadingClientKey(Watched<Arc<CertifiedKey>>);

impl ResolvesClientCert for ReloadingClientKey {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
