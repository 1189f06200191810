//! The CoreDNS mode: a Corefile served by the real server on 127.0.0.1
//! (ephemeral ports, UDP and TCP) and queried with hickory's client; the
//! binary's start-up errors. Loopback only: the binary is never run as a
//! server here (it would listen on every address).

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use flatnet_cluster_dns::Corefile;
use flatnet_cluster_dns::coredns::{self, Listen};
use hickory_net::client::Client;
use hickory_net::proto::op::{DnsResponse, ResponseCode};
use hickory_net::proto::rr::{RData, RecordType};
use hickory_net::runtime::TokioRuntimeProvider;

use common::{query, tcp_client, udp_client};

const BINARY: &str = env!("CARGO_BIN_EXE_flatnet-cluster-dns");

/// "DNS should support configurable pod resolv.conf"'s Corefile as
/// `generateCoreDNSConfigmap` writes it, plus a second server block on
/// another port for a zone of its own.
const COREFILE: &str = ". {\n\thosts {\n\t\t1.1.1.1 notexistname.resolv.conf.local\n\t}\n\tlog\n}\n\
    acme.local:1053 {\n\terrors\n\thosts {\n\t\t2606:4700:4700::1111 abc.acme.local\n\t\tfallthrough\n\t}\n}\n";

/// Binds the Corefile's servers on 127.0.0.1 and runs them; their
/// addresses by the Corefile's port.
async fn start(corefile: &str) -> Vec<(u16, SocketAddr)> {
    let corefile = Corefile::parse(corefile).unwrap();
    let listeners = coredns::bind(&corefile, Listen::Ephemeral(Ipv4Addr::LOCALHOST.into()))
        .await
        .unwrap();
    listeners
        .into_iter()
        .map(|listener| {
            let address = listener.server.local_addr();
            assert!(address.ip().is_loopback());
            assert_ne!(address.port(), 0);
            tokio::spawn(listener.server.run());
            (listener.port, address)
        })
        .collect()
}

fn data(response: &DnsResponse) -> Vec<String> {
    response
        .answers
        .iter()
        .map(|r| r.data.to_string())
        .collect()
}

/// The same questions over either transport.
async fn check_root_block(client: &mut Client<TokioRuntimeProvider>) {
    // What `dig +short +search notexistname` asks first with the pod's
    // search path resolv.conf.local and ndots:2.
    let found = query(client, "notexistname.resolv.conf.local.", RecordType::A).await;
    assert_eq!(found.metadata.response_code, ResponseCode::NoError);
    assert!(found.metadata.authoritative);
    assert!(!found.metadata.recursion_available);
    assert_eq!(data(&found), ["1.1.1.1"]);
    assert_eq!(found.answers[0].ttl, 3600);
    assert!(matches!(found.answers[0].data, RData::A(_)));

    let upper = query(client, "NotExistName.Resolv.Conf.Local.", RecordType::A).await;
    assert_eq!(data(&upper), ["1.1.1.1"]);

    let ptr = query(client, "1.1.1.1.in-addr.arpa.", RecordType::PTR).await;
    assert_eq!(ptr.metadata.response_code, ResponseCode::NoError);
    assert_eq!(data(&ptr), ["notexistname.resolv.conf.local."]);

    let nodata = query(client, "notexistname.resolv.conf.local.", RecordType::AAAA).await;
    assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
    assert!(nodata.answers.is_empty());

    // The resolver's other tries (`notexistname.` alone) and any other
    // name: NXDOMAIN, never forwarded.
    for name in ["notexistname.", "example.com."] {
        let missing = query(client, name, RecordType::A).await;
        assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
        assert!(missing.answers.is_empty());
    }
}

async fn check_acme_block(client: &mut Client<TokioRuntimeProvider>) {
    let found = query(client, "abc.acme.local.", RecordType::AAAA).await;
    assert_eq!(data(&found), ["2606:4700:4700::1111"]);
    let missing = query(client, "def.acme.local.", RecordType::AAAA).await;
    assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
    let outside = query(client, "notexistname.resolv.conf.local.", RecordType::A).await;
    assert_eq!(outside.metadata.response_code, ResponseCode::Refused);
    assert!(outside.answers.is_empty());
}

/// The query log (`log`): captured from this thread's tracing, which the
/// servers' tasks share on the test's single-threaded runtime.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_e2e_corefile_is_served_over_udp_and_tcp() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(coredns::LOG_FILTER)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);

    let servers = start(COREFILE).await;
    let ports: Vec<u16> = servers.iter().map(|(port, _)| *port).collect();
    assert_eq!(ports, [53, 1053]);
    let (root, acme) = (servers[0].1, servers[1].1);
    assert_ne!(root.port(), acme.port());

    check_root_block(&mut udp_client(root)).await;
    check_root_block(&mut tcp_client(root).await).await;
    check_acme_block(&mut udp_client(acme)).await;
    check_acme_block(&mut tcp_client(acme).await).await;

    // `log` in the root block: one line per query there, none for the
    // acme.local block.
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log.lines().filter(|line| line.contains(" IN ")).collect();
    assert_eq!(lines.len(), 2 * 6, "{log}");
    assert!(
        lines.iter().any(
            |line| line.contains("\"A IN notexistname.resolv.conf.local. udp")
                && line.contains("NOERROR qr,aa,rd")
        ),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("\"A IN example.com. tcp") && line.contains("NXDOMAIN")),
        "{log}"
    );
    assert!(!log.contains("acme"), "{log}");
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("flatnet-coredns-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary; (exit code, stderr).
fn run(command: &mut Command) -> (Option<i32>, String) {
    let output = command.output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_missing_corefile_fails_naming_the_file() {
    let (code, stderr) = run(Command::new(BINARY).args(["-conf", "/nonexistent"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot read the Corefile /nonexistent: "),
        "{stderr}"
    );
}

#[test]
fn an_unsupported_corefile_fails_naming_the_line() {
    let dir = TempDir::new("unsupported");
    let corefile = dir.0.join("Corefile");
    std::fs::write(
        &corefile,
        ". {\n\thosts {\n\t\t1.1.1.1 a.example\n\t}\n\tforward . /etc/resolv.conf\n}\n",
    )
    .unwrap();
    let (code, stderr) = run(Command::new(BINARY).arg(format!("--conf={}", corefile.display())));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot serve the Corefile {}: line 5: plugin `forward` is not supported; supported: ",
            corefile.display()
        )),
        "{stderr}"
    );
}

#[test]
fn called_coredns_it_takes_coredns_flags_only() {
    let dir = TempDir::new("name");
    let coredns = dir.0.join("coredns");
    std::os::unix::fs::symlink(BINARY, &coredns).unwrap();

    let (code, stderr) = run(&mut Command::new(&coredns));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.starts_with("no Corefile: give -conf FILE\nUsage: coredns -conf FILE"));

    let (code, stderr) = run(Command::new(&coredns).args(["--listen", "127.0.0.1:53"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("flag provided but not supported: --listen"));

    let (code, stderr) = run(Command::new(&coredns).args(["-conf", "/nonexistent/Corefile"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent/Corefile"), "{stderr}");

    let help = Command::new(&coredns).arg("-help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("Usage: coredns -conf FILE"));
}

#[test]
fn without_conf_the_cluster_mode_still_parses_its_flags() {
    let (code, stderr) = run(Command::new(BINARY).arg("--no-such-flag"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--no-such-flag"), "{stderr}");
    let help = Command::new(BINARY).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--zone"));
}
