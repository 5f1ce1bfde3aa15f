//! `fgpu-controller certs`: the webhooks' serving certificates, issued by fgpu itself (the
//! Helm chart's Job and CronJob run it; no openssl image).
//!
//! The material lives in one Secret: `ca.crt` + `ca.key` (a CA of our own), `tls.crt` +
//! `tls.key` (the serving pair the daemons read through `fgpu_plumbing::tls`, which reloads
//! renewed files) and `ca-bundle.crt` (what goes into the webhooks' `caBundle`: the current
//! CA and, while it is still valid, the one before it, so that a pod still serving a leaf of
//! the old CA stays trusted until it reloads). Pure part first ([`plan`], [`issue`],
//! [`bundle`]: time is an argument), the API calls last ([`ensure`]).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};

/// Secret keys.
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_BUNDLE: &str = "ca-bundle.crt";

/// What the certificates must be.
#[derive(Clone, Debug, clap::Args)]
pub struct Want {
    /// A name the serving certificate must cover (DNS name or IP address); repeat for each
    /// (e.g. fgpu-controller.fgpu-system.svc).
    #[arg(long = "dns-name", value_name = "NAME", required = true)]
    pub names: Vec<String>,
    /// Validity of a new serving certificate, in days.
    #[arg(long, value_name = "DAYS", default_value_t = 365)]
    pub validity_days: u32,
    /// Validity of a new CA, in days.
    #[arg(long, value_name = "DAYS", default_value_t = 3650)]
    pub ca_validity_days: u32,
    /// Renew the serving certificate when it expires within this many days (the CA when it
    /// would expire before a new serving certificate does, plus this margin).
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    pub renew_before_days: u32,
}

/// Why a certificate is (re)issued; `None` in [`Plan`] keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    Missing(&'static str),
    Unreadable(&'static str, String),
    Expiring { key: &'static str, days_left: i64 },
    NamesChanged { missing: Vec<String> },
    NotFromCa(String),
    KeyMismatch(&'static str),
    NewCa,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Missing(k) => write!(f, "{k} missing"),
            Reason::Unreadable(k, e) => write!(f, "{k} unreadable: {e}"),
            Reason::Expiring { key, days_left } => {
                write!(f, "{key} expires in {days_left} days")
            }
            Reason::NamesChanged { missing } => {
                write!(f, "tls.crt does not cover {}", missing.join(", "))
            }
            Reason::NotFromCa(e) => write!(f, "tls.crt is not signed by ca.crt: {e}"),
            Reason::KeyMismatch(k) => write!(f, "{k} does not hold the certificate's key"),
            Reason::NewCa => write!(f, "the CA was renewed"),
        }
    }
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `Some`: issue a new CA.
    pub ca: Option<Reason>,
    /// `Some`: issue a new serving certificate.
    pub leaf: Option<Reason>,
}

impl Plan {
    pub fn keeps_all(&self) -> bool {
        self.ca.is_none() && self.leaf.is_none()
    }
}

/// Errors issuing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("issuing the {what}: {source}")]
    Issue {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("--dns-name {0:?}: not a valid DNS name or IP address")]
    Name(String),
    #[error("Secret {secret}: {source}")]
    Secret {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {name}: {source}")]
    Webhook {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

const DAY: i64 = 86_400;

fn days(d: u32) -> time::Duration {
    time::Duration::seconds(i64::from(d) * DAY)
}

fn pem_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(pem).map_err(|e| e.to_string())?;
    let p = ::pem::parse(text).map_err(|e| e.to_string())?;
    if p.tag() != "CERTIFICATE" {
        return Err(format!("PEM block {:?}, expected CERTIFICATE", p.tag()));
    }
    Ok(p.into_contents())
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    X509Certificate::from_der(der)
        .map(|(_, c)| c)
        .map_err(|e| e.to_string())
}

fn days_left(c: &X509Certificate<'_>, now: OffsetDateTime) -> i64 {
    (c.validity().not_after.timestamp() - now.unix_timestamp()).div_euclid(DAY)
}

fn names_of(c: &X509Certificate<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => out.push((*d).to_owned()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => out.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => out.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    out
}

fn key_matches(key_pem: &[u8], cert: &X509Certificate<'_>) -> bool {
    let Ok(text) = std::str::from_utf8(key_pem) else {
        return false;
    };
    KeyPair::from_pem(text)
        .map(|k| k.public_key_raw() == cert.public_key().subject_public_key.data.as_ref())
        .unwrap_or(false)
}

/// Decide what to (re)issue from what the Secret holds (`data`, possibly empty) at `now`.
pub fn plan(data: &BTreeMap<String, Vec<u8>>, want: &Want, now: OffsetDateTime) -> Plan {
    let ca = check_ca(data, want, now);
    let leaf = if ca.is_some() {
        Some(Reason::NewCa)
    } else {
        check_leaf(data, want, now)
    };
    Plan { ca, leaf }
}

/// The certificate stored under `crt`, parsed, once `key` holds its private key: handed to
/// `check`; or why the pair cannot be used.
fn with_pair(
    data: &BTreeMap<String, Vec<u8>>,
    crt: &'static str,
    key: &'static str,
    check: impl FnOnce(&X509Certificate<'_>) -> Option<Reason>,
) -> Option<Reason> {
    let (Some(pem), Some(key_pem)) = (data.get(crt), data.get(key)) else {
        return Some(Reason::Missing(if data.contains_key(crt) {
            key
        } else {
            crt
        }));
    };
    let der = match pem_der(pem) {
        Ok(d) => d,
        Err(e) => return Some(Reason::Unreadable(crt, e)),
    };
    let c = match parse(&der) {
        Ok(c) => c,
        Err(e) => return Some(Reason::Unreadable(crt, e)),
    };
    if !key_matches(key_pem, &c) {
        return Some(Reason::KeyMismatch(key));
    }
    check(&c)
}

fn check_ca(data: &BTreeMap<String, Vec<u8>>, want: &Want, now: OffsetDateTime) -> Option<Reason> {
    with_pair(data, CA_CRT, CA_KEY, |c| {
        // A CA must outlive every serving certificate it signs, with the renewal margin to
        // spare.
        let left = days_left(c, now);
        (left < i64::from(want.validity_days) + i64::from(want.renew_before_days)).then_some(
            Reason::Expiring {
                key: CA_CRT,
                days_left: left,
            },
        )
    })
}

fn check_leaf(
    data: &BTreeMap<String, Vec<u8>>,
    want: &Want,
    now: OffsetDateTime,
) -> Option<Reason> {
    with_pair(data, TLS_CRT, TLS_KEY, |c| {
        // check_ca passed, so ca.crt parses
        let ca_der = data.get(CA_CRT).and_then(|p| pem_der(p).ok());
        let Some(ca) = ca_der.as_deref().and_then(|d| parse(d).ok()) else {
            return Some(Reason::NotFromCa("ca.crt unreadable".into()));
        };
        if let Err(e) = c.verify_signature(Some(ca.public_key())) {
            return Some(Reason::NotFromCa(format!("signature: {e}")));
        }
        let left = days_left(c, now);
        if left < i64::from(want.renew_before_days) {
            return Some(Reason::Expiring {
                key: TLS_CRT,
                days_left: left,
            });
        }
        let have = names_of(c);
        let missing: Vec<String> = want
            .names
            .iter()
            .filter(|n| !have.contains(n))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Some(Reason::NamesChanged { missing });
        }
        None
    })
}

/// Carry out `plan` on `data`: new material where it says so, the rest kept, and the CA
/// bundle recomputed. Returns the Secret's new data.
pub fn issue(
    data: &BTreeMap<String, Vec<u8>>,
    plan: &Plan,
    want: &Want,
    now: OffsetDateTime,
) -> Result<BTreeMap<String, Vec<u8>>, CertsError> {
    let err = |what| move |source| CertsError::Issue { what, source };
    let mut out = data.clone();
    let not_before = now - time::Duration::hours(1); // clock skew between nodes
    if plan.ca.is_some() {
        let key = KeyPair::generate().map_err(err("CA key"))?;
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(
            DnType::CommonName,
            format!("fgpu-webhook-ca-{}", now.unix_timestamp()),
        );
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.not_before = not_before;
        p.not_after = now + days(want.ca_validity_days);
        let cert = p.self_signed(&key).map_err(err("CA certificate"))?;
        out.insert(CA_CRT.into(), cert.pem().into_bytes());
        out.insert(CA_KEY.into(), key.serialize_pem().into_bytes());
    }
    if plan.leaf.is_some() {
        let ca_key = std::str::from_utf8(&out[CA_KEY])
            .ok()
            .and_then(|t| KeyPair::from_pem(t).ok())
            .ok_or(CertsError::Issue {
                what: "serving certificate (ca.key unreadable)",
                source: rcgen::Error::CouldNotParseKeyPair,
            })?;
        let ca_pem = String::from_utf8_lossy(&out[CA_CRT]).into_owned();
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(err("CA (ca.crt)"))?;
        let mut p =
            CertificateParams::new(Vec::<String>::new()).map_err(err("serving certificate"))?;
        for n in &want.names {
            p.subject_alt_names
                .push(match n.parse::<std::net::IpAddr>() {
                    Ok(ip) => rcgen::SanType::IpAddress(ip),
                    Err(_) if valid_dns(n) => rcgen::SanType::DnsName(
                        n.clone()
                            .try_into()
                            .map_err(|_| CertsError::Name(n.clone()))?,
                    ),
                    Err(_) => return Err(CertsError::Name(n.clone())),
                });
        }
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(
            DnType::CommonName,
            want.names.first().cloned().unwrap_or_default(),
        );
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        p.not_before = not_before;
        p.not_after = now + days(want.validity_days);
        let key = KeyPair::generate().map_err(err("serving key"))?;
        let cert = p
            .signed_by(&key, &issuer)
            .map_err(err("serving certificate"))?;
        out.insert(TLS_CRT.into(), cert.pem().into_bytes());
        out.insert(TLS_KEY.into(), key.serialize_pem().into_bytes());
    }
    let b = bundle(data.get(CA_BUNDLE).map(Vec::as_slice), &out[CA_CRT], now);
    out.insert(CA_BUNDLE.into(), b);
    Ok(out)
}

/// A DNS name: dot-separated labels of letters, digits and inner hyphens (RFC 1123), the
/// first may be `*`.
fn valid_dns(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').enumerate().all(|(i, l)| {
            (i == 0 && l == "*")
                || (!l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-'))
        })
}

/// The `caBundle`: `ca` first, then every other certificate of `previous` that is still
/// valid at `now` (the CA before a rotation, until it expires).
pub fn bundle(previous: Option<&[u8]>, ca: &[u8], now: OffsetDateTime) -> Vec<u8> {
    let mut out = ca.to_vec();
    let cur = pem_der(ca).ok();
    let Some(prev) = previous.and_then(|p| std::str::from_utf8(p).ok()) else {
        return out;
    };
    for p in ::pem::parse_many(prev).unwrap_or_default() {
        if p.tag() != "CERTIFICATE" || Some(p.contents()) == cur.as_deref() {
            continue;
        }
        let Ok(c) = parse(p.contents()) else { continue };
        if days_left(&c, now) < 0 {
            continue;
        }
        if !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(::pem::encode(&p).as_bytes());
    }
    out
}

/// `fgpu-controller certs` arguments.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    pub command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum CertsCommand {
    /// Make the Secret hold a valid CA and serving certificate (issuing or renewing what is
    /// missing, expiring or for other names), then set the webhooks' caBundle to its CA
    /// bundle. Idempotent: run it at install, upgrade and from a CronJob.
    Ensure(Box<EnsureArgs>),
    /// Write ca.crt, ca.key, tls.crt, tls.key and ca-bundle.crt into a directory (no API
    /// server; for manifests applied by hand and for tests).
    Generate(Box<GenerateArgs>),
}

#[derive(Debug, clap::Args)]
pub struct EnsureArgs {
    #[command(flatten)]
    pub kube: fgpu_plumbing::client::KubeArgs,
    /// Namespace of the Secret.
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// The Secret that holds the material (created when absent).
    #[arg(long, value_name = "NAME")]
    pub secret: String,
    /// A MutatingWebhookConfiguration whose webhooks get the CA bundle; repeat for each. One
    /// that does not exist yet is reported and skipped.
    #[arg(long = "mutating-webhook", value_name = "NAME")]
    pub mutating: Vec<String>,
    /// A ValidatingWebhookConfiguration, likewise.
    #[arg(long = "validating-webhook", value_name = "NAME")]
    pub validating: Vec<String>,
    /// Wait this long for the named webhook configurations to appear (an install creates
    /// them beside the Job).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub wait_seconds: u64,
    #[command(flatten)]
    pub want: Want,
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Directory to write into (created).
    #[arg(long, value_name = "DIR")]
    pub out_dir: std::path::PathBuf,
    #[command(flatten)]
    pub want: Want,
}

/// Run `certs`.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Generate(a) => {
            let data = issue(
                &BTreeMap::new(),
                &plan(&BTreeMap::new(), &a.want, now()),
                &a.want,
                now(),
            )?;
            std::fs::create_dir_all(&a.out_dir)?;
            for (k, v) in &data {
                let path = a.out_dir.join(k);
                std::fs::write(&path, v)?;
                if k.ends_with(".key") {
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                }
            }
            println!("wrote {} files to {}", data.len(), a.out_dir.display());
            Ok(())
        }
        CertsCommand::Ensure(a) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(ensure(&a))
        }
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn decode(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

async fn ensure(a: &EnsureArgs) -> anyhow::Result<()> {
    let client = a.kube.client().await?;
    ensure_with(client, a, now()).await
}

/// [`ensure`] with a given client and time (tests: the fake API server).
async fn ensure_with(
    client: kube::Client,
    a: &EnsureArgs,
    t: OffsetDateTime,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &a.namespace);
    let sname = format!("{}/{}", a.namespace, a.secret);
    let serr = |source| CertsError::Secret {
        secret: sname.clone(),
        source,
    };
    let existing = secrets.get_opt(&a.secret).await.map_err(serr)?;
    let data = existing.as_ref().map(decode).unwrap_or_default();
    let p = plan(&data, &a.want, t);
    let data = if p.keeps_all() {
        let b = bundle(data.get(CA_BUNDLE).map(Vec::as_slice), &data[CA_CRT], t);
        tracing::info!(secret = %sname, "certificates valid, kept");
        let mut d = data;
        d.insert(CA_BUNDLE.into(), b);
        d
    } else {
        let new = issue(&data, &p, &a.want, t)?;
        let why = |r: &Option<Reason>| r.as_ref().map(ToString::to_string);
        tracing::info!(secret = %sname, ca = ?why(&p.ca), serving = ?why(&p.leaf), "issued certificates");
        new
    };
    let changed = existing.as_ref().map(decode) != Some(data.clone());
    if changed {
        let bytes = data
            .iter()
            .map(|(k, v)| (k.clone(), ByteString(v.clone())))
            .collect();
        match existing {
            // Replace, carrying the resourceVersion: a concurrent writer makes this fail
            // (409) and the Job retries, rather than one pair overwriting the other.
            Some(mut s) => {
                s.data = Some(bytes);
                secrets
                    .replace(&a.secret, &PostParams::default(), &s)
                    .await
                    .map_err(serr)?;
            }
            None => {
                let s = Secret {
                    metadata: ObjectMeta {
                        name: Some(a.secret.clone()),
                        namespace: Some(a.namespace.clone()),
                        ..Default::default()
                    },
                    data: Some(bytes),
                    ..Default::default()
                };
                secrets
                    .create(&PostParams::default(), &s)
                    .await
                    .map_err(serr)?;
            }
        }
    }
    let ca = data[CA_BUNDLE].clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(a.wait_seconds);
    let mw: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for name in &a.mutating {
        patch_bundle(
            &mw,
            "MutatingWebhookConfiguration",
            name,
            &ca,
            deadline,
            |o| {
                o.webhooks
                    .iter_mut()
                    .flatten()
                    .map(|w| &mut w.client_config.ca_bundle)
                    .collect()
            },
        )
        .await?;
    }
    let vw: Api<ValidatingWebhookConfiguration> = Api::all(client);
    for name in &a.validating {
        patch_bundle(
            &vw,
            "ValidatingWebhookConfiguration",
            name,
            &ca,
            deadline,
            |o| {
                o.webhooks
                    .iter_mut()
                    .flatten()
                    .map(|w| &mut w.client_config.ca_bundle)
                    .collect()
            },
        )
        .await?;
    }
    Ok(())
}

/// Set every webhook's caBundle of one configuration to `ca` (a replace carrying the
/// resourceVersion, retried on conflict).
async fn patch_bundle<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    ca: &[u8],
    deadline: std::time::Instant,
    bundles: impl Fn(&mut K) -> Vec<&mut Option<ByteString>>,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let werr = |source| CertsError::Webhook {
        kind,
        name: name.to_owned(),
        source,
    };
    loop {
        let Some(mut obj) = api.get_opt(name).await.map_err(werr)? else {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    kind,
                    name,
                    "not found: caBundle not set (install the chart, or drop the flag)"
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            continue;
        };
        let mut changed = 0;
        for b in bundles(&mut obj) {
            if b.as_ref().map(|b| b.0.as_slice()) != Some(ca) {
                *b = Some(ByteString(ca.to_vec()));
                changed += 1;
            }
        }
        if changed == 0 {
            tracing::info!(kind, name, "caBundle current");
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &obj).await {
            Ok(_) => {
                tracing::info!(kind, name, webhooks = changed, ca_sha = %short(ca), "caBundle set");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(werr(e).into()),
        }
    }
}

fn short(ca: &[u8]) -> String {
    let b = base64::engine::general_purpose::STANDARD.encode(ca);
    b.chars().rev().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(names: &[&str]) -> Want {
        Want {
            names: names.iter().map(|s| s.to_string()).collect(),
            validity_days: 365,
            ca_validity_days: 3650,
            renew_before_days: 30,
        }
    }

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn fresh(w: &Want, at: OffsetDateTime) -> BTreeMap<String, Vec<u8>> {
        let empty = BTreeMap::new();
        issue(&empty, &plan(&empty, w, at), w, at).unwrap()
    }

    fn leaf_of(d: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
        pem_der(&d[TLS_CRT]).unwrap()
    }

    #[test]
    fn empty_secret_issues_both_and_the_leaf_verifies_against_the_ca() {
        let w = want(&["fgpu-controller.fgpu-system.svc", "127.0.0.1"]);
        let p = plan(&BTreeMap::new(), &w, t0());
        assert_eq!(p.ca, Some(Reason::Missing(CA_CRT)));
        assert_eq!(p.leaf, Some(Reason::NewCa));
        let d = issue(&BTreeMap::new(), &p, &w, t0()).unwrap();
        let leaf = leaf_of(&d);
        let c = parse(&leaf).unwrap();
        let ca_der = pem_der(&d[CA_CRT]).unwrap();
        let ca = parse(&ca_der).unwrap();
        c.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(
            names_of(&c),
            ["fgpu-controller.fgpu-system.svc", "127.0.0.1"]
        );
        assert!(ca.is_ca());
        assert!(!c.is_ca());
        assert_eq!(days_left(&c, t0()), 365);
        assert_eq!(days_left(&ca, t0()), 3650);
        assert!(key_matches(&d[TLS_KEY], &c));
        // the bundle is the CA alone
        assert_eq!(d[CA_BUNDLE], d[CA_CRT]);
        // and a second look keeps everything
        assert!(plan(&d, &w, t0()).keeps_all());
    }

    #[test]
    fn a_leaf_near_expiry_is_renewed_with_the_same_ca() {
        let w = want(&["svc.ns.svc"]);
        let d = fresh(&w, t0());
        let later = t0() + days(336); // 29 days left
        let p = plan(&d, &w, later);
        assert_eq!(p.ca, None);
        assert_eq!(
            p.leaf,
            Some(Reason::Expiring {
                key: TLS_CRT,
                days_left: 29
            })
        );
        let d2 = issue(&d, &p, &w, later).unwrap();
        assert_eq!(d2[CA_CRT], d[CA_CRT], "the CA is kept");
        assert_eq!(
            d2[CA_BUNDLE], d[CA_BUNDLE],
            "so the caBundle does not change"
        );
        assert_ne!(d2[TLS_CRT], d[TLS_CRT]);
        assert!(plan(&d2, &w, later).keeps_all());
        // 31 days left: kept
        assert!(plan(&d, &w, t0() + days(334)).keeps_all());
    }

    #[test]
    fn an_expiring_ca_is_renewed_and_the_old_one_stays_in_the_bundle_until_it_expires() {
        let w = want(&["svc.ns.svc"]);
        let d = fresh(&w, t0());
        // 3650 - 3260 = 390 days left < 365 + 30
        let later = t0() + days(3260);
        let p = plan(&d, &w, later);
        assert!(
            matches!(p.ca, Some(Reason::Expiring { key: CA_CRT, .. })),
            "{p:?}"
        );
        let d2 = issue(&d, &p, &w, later).unwrap();
        assert_ne!(d2[CA_CRT], d[CA_CRT]);
        let b = String::from_utf8(d2[CA_BUNDLE].clone()).unwrap();
        assert_eq!(b.matches("BEGIN CERTIFICATE").count(), 2, "{b}");
        assert!(b.starts_with(std::str::from_utf8(&d2[CA_CRT]).unwrap()));
        // once the old CA has expired it leaves the bundle
        let much_later = t0() + days(3651);
        let b2 = bundle(Some(&d2[CA_BUNDLE]), &d2[CA_CRT], much_later);
        assert_eq!(b2, d2[CA_CRT]);
    }

    #[test]
    fn new_names_reissue_the_leaf() {
        let d = fresh(&want(&["a.ns.svc"]), t0());
        let p = plan(&d, &want(&["a.ns.svc", "b.ns.svc"]), t0());
        assert_eq!(p.ca, None);
        assert_eq!(
            p.leaf,
            Some(Reason::NamesChanged {
                missing: vec!["b.ns.svc".into()]
            })
        );
    }

    #[test]
    fn a_leaf_from_another_ca_or_a_swapped_key_is_not_kept() {
        let w = want(&["a.ns.svc"]);
        let mine = fresh(&w, t0());
        let other = fresh(&w, t0());
        // attack: someone puts a pair signed by their own CA into the Secret
        let mut forged = mine.clone();
        forged.insert(TLS_CRT.into(), other[TLS_CRT].clone());
        forged.insert(TLS_KEY.into(), other[TLS_KEY].clone());
        assert!(matches!(
            plan(&forged, &w, t0()).leaf,
            Some(Reason::NotFromCa(_))
        ));
        // a key that is not the certificate's
        let mut swapped = mine.clone();
        swapped.insert(TLS_KEY.into(), other[TLS_KEY].clone());
        assert_eq!(
            plan(&swapped, &w, t0()).leaf,
            Some(Reason::KeyMismatch(TLS_KEY))
        );
        // a CA key that is not the CA's
        let mut ca_swapped = mine.clone();
        ca_swapped.insert(CA_KEY.into(), other[CA_KEY].clone());
        assert_eq!(
            plan(&ca_swapped, &w, t0()).ca,
            Some(Reason::KeyMismatch(CA_KEY))
        );
    }

    #[test]
    fn garbage_is_replaced_not_trusted() {
        let w = want(&["a.ns.svc"]);
        let mut d = fresh(&w, t0());
        d.insert(TLS_CRT.into(), b"not a pem".to_vec());
        assert!(matches!(
            plan(&d, &w, t0()).leaf,
            Some(Reason::Unreadable(TLS_CRT, _))
        ));
        d.insert(
            CA_CRT.into(),
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_vec(),
        );
        assert!(matches!(
            plan(&d, &w, t0()).ca,
            Some(Reason::Unreadable(CA_CRT, _))
        ));
        d.remove(CA_KEY);
        assert_eq!(plan(&d, &w, t0()).ca, Some(Reason::Missing(CA_KEY)));
    }

    fn ensure_args(wait_seconds: u64) -> EnsureArgs {
        EnsureArgs {
            kube: Default::default(),
            namespace: "fgpu-system".into(),
            secret: "tls".into(),
            mutating: vec!["gate".into()],
            validating: vec!["claims".into()],
            wait_seconds,
            want: want(&["fgpu-controller.fgpu-system.svc"]),
        }
    }

    const SECRET: &str = "/api/v1/namespaces/fgpu-system/secrets/tls";
    const GATE: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gate";
    const CLAIMS: &str =
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/claims";

    fn webhook_config(kind: &str, bundle: Option<&str>) -> serde_json::Value {
        let mut cc = serde_json::json!({"service": {"namespace": "fgpu-system", "name": "fgpu-controller", "path": "/p"}});
        if let Some(b) = bundle {
            cc["caBundle"] = serde_json::json!(b);
        }
        serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "webhooks": [{"name": "w.gpu.fgpu.dev", "clientConfig": cc, "sideEffects": "None",
                          "admissionReviewVersions": ["v1"]}]})
    }

    fn stored_bundle(fake: &fgpu_plumbing::testing::FakeApiServer, key: &str) -> Vec<u8> {
        let st = fake.lock().unwrap();
        let b = st.objects[key]["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        base64::engine::general_purpose::STANDARD
            .decode(b)
            .unwrap_or_default()
    }

    fn stored_secret(fake: &fgpu_plumbing::testing::FakeApiServer) -> BTreeMap<String, Vec<u8>> {
        let st = fake.lock().unwrap();
        let s: Secret = serde_json::from_value(st.objects[SECRET].clone()).unwrap();
        decode(&s)
    }

    /// The chart's shape: the Secret declared empty, the webhooks with a stale caBundle; then
    /// the daily run that finds everything valid; then someone's forged pair.
    #[tokio::test]
    async fn ensure_fills_the_declared_secret_sets_the_bundles_and_keeps_what_is_valid() {
        let fake = fgpu_plumbing::testing::FakeApiServer::new();
        {
            let mut st = fake.lock().unwrap();
            st.insert(
                SECRET,
                serde_json::json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque"}),
            );
            st.insert(
                GATE,
                webhook_config("MutatingWebhookConfiguration", Some("c3RhbGU=")),
            );
            st.insert(
                CLAIMS,
                webhook_config("ValidatingWebhookConfiguration", None),
            );
        }
        let a = ensure_args(0);
        ensure_with(fake.client(), &a, t0()).await.unwrap();
        let d = stored_secret(&fake);
        assert_eq!(
            d.keys().map(String::as_str).collect::<Vec<_>>(),
            [CA_BUNDLE, CA_CRT, CA_KEY, TLS_CRT, TLS_KEY]
        );
        assert!(plan(&d, &a.want, t0()).keeps_all());
        assert_eq!(stored_bundle(&fake, GATE), d[CA_BUNDLE]);
        assert_eq!(stored_bundle(&fake, CLAIMS), d[CA_BUNDLE]);
        assert_eq!(
            fake.lock().unwrap().writes,
            [
                format!("replace {SECRET}"),
                format!("replace {GATE}"),
                format!("replace {CLAIMS}")
            ]
        );

        // the next day: nothing to write
        ensure_with(fake.client(), &a, t0() + days(1))
            .await
            .unwrap();
        assert_eq!(
            fake.lock().unwrap().writes.len(),
            3,
            "a valid Secret and current bundles are not rewritten"
        );

        // attack: a pair from another CA put into the Secret is replaced, the CA kept
        let other = fresh(&a.want, t0());
        {
            let mut st = fake.lock().unwrap();
            let mut s = st.objects[SECRET].clone();
            s["data"]["tls.crt"] = serde_json::json!(
                base64::engine::general_purpose::STANDARD.encode(&other[TLS_CRT])
            );
            s["data"]["tls.key"] = serde_json::json!(
                base64::engine::general_purpose::STANDARD.encode(&other[TLS_KEY])
            );
            st.insert(SECRET, s);
        }
        ensure_with(fake.client(), &a, t0() + days(2))
            .await
            .unwrap();
        let d2 = stored_secret(&fake);
        assert_ne!(d2[TLS_CRT], other[TLS_CRT]);
        assert_eq!(d2[CA_CRT], d[CA_CRT]);
        assert!(plan(&d2, &a.want, t0() + days(2)).keeps_all());
    }

    #[tokio::test]
    async fn a_missing_secret_is_created_and_a_missing_webhook_skipped() {
        let fake = fgpu_plumbing::testing::FakeApiServer::new();
        ensure_with(fake.client(), &ensure_args(0), t0())
            .await
            .unwrap();
        assert_eq!(fake.lock().unwrap().writes, [format!("create {SECRET}")]);
    }

    #[test]
    fn bad_names_are_refused_with_the_flag() {
        let w = want(&["not a dns name!"]);
        let e = issue(
            &BTreeMap::new(),
            &plan(&BTreeMap::new(), &w, t0()),
            &w,
            t0(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("--dns-name \"not a dns name!\""),
            "{e}"
        );
    }
}
