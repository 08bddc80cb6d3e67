//! Real `redis-server` processes for the store tests: each test starts its
//! own on a free 127.0.0.1 port (plain or TLS, optionally with an ACL user
//! and an append-only file), can kill it and start it again on the same
//! port, and the process is killed when the handle drops. Tests skip with
//! a printed reason when `redis-server` is not installed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};

use crate::common::{free_port, skipped, WAIT};

/// The `redis-server` binary, or `None` after printing why the test skips.
pub fn binary(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("redis-server"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        skipped(
            test,
            "redis-server is not installed (apt-get install redis-server)",
        );
    }
    found
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "patchbay-test-{}-{}-{name}",
            std::process::id(),
            patchbay_gateway::ids::short_id()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn file(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA (PEM) and a certificate + key for 127.0.0.1 signed by it. The two
/// have distinct subjects: OpenSSL (`redis-cli`, and `redis-server` itself
/// when it connects to a replica's primary or a cluster peer over TLS)
/// takes a leaf whose subject is its issuer's for self-issued and refuses
/// it. Each CA's name is its own, so a certificate of another `pki()` is
/// one of an unknown issuer.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("patchbay test CA {}", patchbay_gateway::ids::short_id()),
    );
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut leaf_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    }
}

pub struct RedisServer {
    binary: PathBuf,
    args: Vec<String>,
    process: Option<std::process::Child>,
    pub port: u16,
    pub dir: TempDir,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl RedisServer {
    /// A plain server; `extra` are more `redis-server` arguments.
    pub async fn plain(test: &str, extra: &[&str]) -> Option<Self> {
        let binary = binary(test)?;
        let dir = TempDir::new("redis");
        let port = free_port();
        let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(base_args(&dir));
        args.extend(extra.iter().map(|s| s.to_string()));
        Some(Self::launch(binary, args, port, dir).await)
    }

    /// A TLS-only server with `pki`'s certificate; `extra` as for `plain`.
    pub async fn tls(test: &str, pki: &Pki, extra: &[&str]) -> Option<Self> {
        let binary = binary(test)?;
        let dir = TempDir::new("redis-tls");
        let port = free_port();
        let ca = dir.file("ca.pem", &pki.ca_pem);
        let cert = dir.file("server.pem", &pki.cert_pem);
        let key = dir.file("server.key", &pki.key_pem);
        let mut args: Vec<String> = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--tls-cert-file".into(),
            cert.display().to_string(),
            "--tls-key-file".into(),
            key.display().to_string(),
            "--tls-ca-cert-file".into(),
            ca.display().to_string(),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        args.extend(base_args(&dir));
        args.extend(extra.iter().map(|s| s.to_string()));
        Some(Self::launch(binary, args, port, dir).await)
    }

    async fn launch(binary: PathBuf, args: Vec<String>, port: u16, dir: TempDir) -> Self {
        let mut s = Self {
            binary,
            args,
            process: None,
            port,
            dir,
        };
        s.start().await;
        s
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Starts the server (again, on the same port and directory) and waits
    /// until it accepts connections.
    pub async fn start(&mut self) {
        assert!(self.process.is_none(), "already running");
        let process = std::process::Command::new(&self.binary)
            .args(&self.args)
            .current_dir(&self.dir.0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.process = Some(process);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
                return;
            }
            if let Some(status) = self.process.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "redis-server exited at start ({status}); args {:?}",
                    self.args
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server never listened on {}",
                self.addr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, as a crash or a lost node would, and reaps the process.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn base_args(dir: &TempDir) -> Vec<String> {
    [
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.0.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
