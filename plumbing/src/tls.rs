//! TLS for the webhooks: the process-wide provider, and a server configuration whose
//! certificate follows its files.
//!
//! [`ReloadingCert`] reads the PEM certificate chain and key at start (errors name the
//! flag and the file), and again when either file's modification time changes, looked at no
//! more than once per [`RECHECK`] from the handshakes themselves: a renewed Secret (cert-
//! manager, the kubelet's projected volume) is served without a restart. A renewal that
//! cannot be read, or whose key does not match, is logged and the last good pair is kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often a handshake may look at the files' modification times.
pub const RECHECK: Duration = Duration::from_secs(10);

/// Why a certificate and key could not be used. Each names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {}: {problem}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("--tls-cert/--tls-key do not make a certificate and its key: {0}")]
    Pair(#[source] rustls::Error),
    #[error("TLS protocol versions: {0}")]
    Versions(#[source] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err(flag: &'static str, path: &Path, problem: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        flag,
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

/// The certificate chain and key in `cert` and `key` (PEM), checked to belong together.
pub fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err("--tls-cert", cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err("--tls-cert", cert, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(file_err("--tls-cert", cert, "no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            file_err("--tls-key", key, "no private key in the file")
        }
        e => file_err("--tls-key", key, format!("not a PEM private key: {e}")),
    })?;
    CertifiedKey::from_der(chain, key_der, &provider()).map_err(TlsError::Pair)
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// A certificate resolver that reloads its files when they change (see the module docs).
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// When the files were last looked at, and their modification times then.
    seen: Mutex<(Instant, Option<SystemTime>, Option<SystemTime>)>,
}

impl ReloadingCert {
    /// Reads the pair now; errors name the flag and the file.
    pub fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let pair = load_pair(cert, key)?;
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(pair)),
            seen: Mutex::new((Instant::now(), modified(cert), modified(key))),
        })
    }

    /// Looks at the files (at most once per `every`) and reloads them when they changed.
    /// Returns whether a new pair is served now.
    pub fn refresh(&self, every: Duration) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        if seen.0.elapsed() < every {
            return false;
        }
        let now = (modified(&self.cert), modified(&self.key));
        let changed = (seen.1, seen.2) != now;
        *seen = (Instant::now(), now.0, now.1);
        drop(seen);
        if !changed {
            return false;
        }
        match load_pair(&self.cert, &self.key) {
            Ok(pair) => {
                if let Ok(mut cur) = self.current.write() {
                    *cur = Arc::new(pair);
                }
                tracing::info!(cert = %self.cert.display(), "serving a renewed certificate");
                true
            }
            Err(e) => {
                tracing::warn!("keeping the previous certificate: {e}");
                false
            }
        }
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh(RECHECK);
        Some(self.current())
    }
}

/// The CA certificates (PEM) in `path`, for verifying client certificates; errors name
/// `flag` and the file.
pub fn load_client_roots(
    flag: &'static str,
    path: &Path,
) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).map_err(|e| file_err(flag, path, e))? {
        let c = c.map_err(|e| file_err(flag, path, format!("not PEM certificates: {e}")))?;
        roots
            .add(c)
            .map_err(|e| file_err(flag, path, format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(file_err(flag, path, "no certificate in the file"));
    }
    Ok(roots)
}

/// A server configuration like [`server_config`] that also requires every client to
/// present a certificate signed by one of the CAs in `client_ca` (PEM; errors name
/// `ca_flag`): mutual TLS. A client without one, or with another CA's, fails the handshake.
pub fn server_config_mutual(
    cert: &Path,
    key: &Path,
    ca_flag: &'static str,
    client_ca: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let roots = Arc::new(load_client_roots(ca_flag, client_ca)?);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| {
            file_err(
                ca_flag,
                client_ca,
                format!("cannot verify clients with it: {e}"),
            )
        })?;
    let resolver = Arc::new(ReloadingCert::new(cert, key)?);
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    Ok(Arc::new(cfg))
}

/// A server configuration (TLS 1.2 and 1.3, no client certificates, HTTP/1.1) serving the
/// pair in `cert` / `key`, reloaded when the files change.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let resolver = Arc::new(ReloadingCert::new(cert, key)?);
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{File, FileTimes};
    use std::path::PathBuf;

    /// The extender's test serving pair (`controller/extender/tests/data/webhook-tls`).
    fn data(file: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../controller/extender/tests/data/webhook-tls")
            .join(file)
    }

    /// Writes `bytes` to `path` and moves its modification time `secs` forward, so that a
    /// change within the file system's time granularity is still seen.
    fn rewrite(path: &Path, bytes: &[u8], secs: u64) {
        std::fs::write(path, bytes).unwrap();
        let t = SystemTime::now() + Duration::from_secs(secs);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_times(FileTimes::new().set_modified(t))
            .unwrap();
    }

    #[test]
    fn a_renewal_is_served_and_a_broken_one_keeps_the_last_good_pair() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (good_cert, good_key) = (
            std::fs::read(data("tls.crt")).unwrap(),
            std::fs::read(data("tls.key")).unwrap(),
        );
        std::fs::write(&cert, &good_cert).unwrap();
        std::fs::write(&key, &good_key).unwrap();
        let r = ReloadingCert::new(&cert, &key).unwrap();
        let first = r.current();

        assert!(!r.refresh(Duration::ZERO), "nothing changed");
        rewrite(&key, b"not a key\n", 10);
        assert!(
            !r.refresh(Duration::ZERO),
            "an unreadable key is not served"
        );
        assert!(
            Arc::ptr_eq(&first, &r.current()),
            "the last good pair stays"
        );

        rewrite(&key, &good_key, 20);
        assert!(
            !r.refresh(Duration::from_secs(3600)),
            "not looked at again so soon"
        );
        assert!(r.refresh(Duration::ZERO), "the renewed pair is read");
        assert!(!Arc::ptr_eq(&first, &r.current()));
        assert_eq!(r.current().cert, first.cert);
    }

    #[test]
    fn load_errors_name_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = load_pair(&empty, &data("tls.key")).unwrap_err().to_string();
        assert!(
            e.starts_with("--tls-cert ") && e.ends_with("no certificate in the file"),
            "{e}"
        );
        let e = load_pair(&data("tls.crt"), &empty).unwrap_err().to_string();
        assert!(
            e.starts_with("--tls-key ") && e.ends_with("no private key in the file"),
            "{e}"
        );
    }
}
