//! The cluster's PKI, as kubeadm lays it out: one CA that signs the API
//! server's serving certificate, every client certificate (admin, the
//! controllers, each kubelet, kube-proxy) and each kubelet's serving
//! certificate, and a key pair for service account tokens. Kubeconfigs
//! carry their certificates inline, so each component reads one file.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::prelude::{BASE64_STANDARD, Engine as _};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its key, PEM, as written to `<name>.crt` / `<name>.key`.
pub struct Credential {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Who a client certificate names: the user (CN) and groups (O) the API
/// server's x509 authenticator reads.
pub struct Subject<'a> {
    pub user: &'a str,
    pub groups: &'a [&'a str],
}

pub struct Pki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    pub ca_cert: PathBuf,
    pub ca_pem: String,
    /// The service account token signing key (private) and its public half.
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

impl Pki {
    /// A new CA and service account key pair in `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let key = KeyPair::generate().context("generating the CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "flatnet-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).context("signing the CA")?;
        let ca_pem = cert.pem();
        let ca_cert = dir.join("ca.crt");
        write_private(&ca_cert, &ca_pem)?;
        write_private(&dir.join("ca.key"), &key.serialize_pem())?;
        let service_account = KeyPair::generate().context("generating the service account key")?;
        let service_account_key = dir.join("sa.key");
        let service_account_pub = dir.join("sa.pub");
        write_private(&service_account_key, &service_account.serialize_pem())?;
        write_private(&service_account_pub, &service_account.public_key_pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: Issuer::new(params, key),
            ca_cert,
            ca_pem,
            service_account_key,
            service_account_pub,
        })
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// A client certificate for `subject`.
    pub fn client(&self, name: &str, subject: &Subject) -> anyhow::Result<Credential> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, subject.user);
        for group in subject.groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(name, params)
    }

    /// A serving certificate for the given DNS names and addresses.
    pub fn server(
        &self,
        name: &str,
        common_name: &str,
        dns_names: &[&str],
        addresses: &[IpAddr],
    ) -> anyhow::Result<Credential> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for dns in dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName((*dns).try_into()?));
        }
        for address in addresses {
            params.subject_alt_names.push(SanType::IpAddress(*address));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(name, params)
    }

    fn sign(&self, name: &str, mut params: CertificateParams) -> anyhow::Result<Credential> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().with_context(|| format!("generating {name}'s key"))?;
        let cert = params
            .signed_by(&key, &self.ca)
            .with_context(|| format!("signing {name}'s certificate"))?;
        let credential = Credential {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        write_private(&credential.cert, &credential.cert_pem)?;
        write_private(&credential.key, &credential.key_pem)?;
        Ok(credential)
    }

    /// A kubeconfig for `server` that authenticates with `credential`,
    /// written to `<dir>/<name>.kubeconfig`.
    pub fn kubeconfig(
        &self,
        name: &str,
        server: &str,
        credential: &Credential,
    ) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        write_private(
            &path,
            &kubeconfig_text(
                server,
                &self.ca_pem,
                &credential.cert_pem,
                &credential.key_pem,
            ),
        )?;
        Ok(path)
    }
}

/// A one-context kubeconfig with everything inline.
fn kubeconfig_text(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |text: &str| BASE64_STANDARD.encode(text);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: flatnet-e2e
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: user
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: flatnet-e2e
  context:
    cluster: flatnet-e2e
    user: user
current-context: flatnet-e2e
",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

/// Keys and kubeconfigs readable by root only.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_name_their_subject_and_the_kubeconfig_embeds_them() {
        let dir = std::env::temp_dir().join(format!("flatnet-pki-test-{}", std::process::id()));
        let pki = Pki::create(&dir).unwrap();
        let admin = pki
            .client(
                "admin",
                &Subject {
                    user: "kubernetes-admin",
                    groups: &["system:masters"],
                },
            )
            .unwrap();
        assert!(admin.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let config = pki
            .kubeconfig("admin", "https://10.0.0.1:6443", &admin)
            .unwrap();
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("server: https://10.0.0.1:6443"));
        assert!(text.contains(&BASE64_STANDARD.encode(&pki.ca_pem)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
