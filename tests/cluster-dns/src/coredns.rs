//! The CoreDNS mode: `-conf FILE` (or the program called `coredns`)
//! serves a Corefile's `hosts` entries instead of the cluster (see the
//! crate doc for what is supported). The command line is read as Go's
//! flag package reads CoreDNS's; the Corefile by [`crate::corefile`]; the
//! answers come from [`HostsResolver`], served by [`DnsServer`].

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::corefile::Corefile;
use crate::error::{ArgsError, CorednsError, CorefileError, ServerError};
use crate::hosts::HostsResolver;
use crate::server::DnsServer;

/// The program name that selects the mode whatever the arguments.
pub const PROGRAM_NAME: &str = "coredns";

/// The mode's log filter: the query log (`log`) and startup at info;
/// hickory logs every query at info, hence its warn.
pub const LOG_FILTER: &str = "info,hickory_server=warn";

/// What `-help` prints.
pub const USAGE: &str = "\
Usage: coredns -conf FILE

flatnet-cluster-dns in its CoreDNS mode: serves the Corefile FILE, whose
server blocks `ZONE[:PORT] { ... }` may hold the plugins hosts (inline
`IP NAME [NAME...]` entries and `fallthrough`), log and errors. A/AAAA and
PTR from the entries; other names in a zone NXDOMAIN, names outside every
zone REFUSED; nothing is forwarded.
";

/// What the command line of the mode asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Serve this Corefile.
    Serve { conf: PathBuf },
    /// `-h`, `-help`: print [`USAGE`].
    Help,
}

fn conf_flag(arg: &str) -> bool {
    ["-conf", "--conf"]
        .iter()
        .any(|flag| arg == *flag || arg.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
}

impl Invocation {
    /// None when `args` (the program name first) are not for the CoreDNS
    /// mode: the program is not called `coredns` and no argument is
    /// `-conf`/`--conf` (alone or with `=FILE`).
    pub fn from_args(args: &[OsString]) -> Option<Result<Self, ArgsError>> {
        let called_coredns = args
            .first()
            .and_then(|program| Path::new(program).file_name())
            .is_some_and(|name| name == PROGRAM_NAME);
        let conf_given = args
            .iter()
            .skip(1)
            .any(|arg| arg.to_str().is_some_and(conf_flag));
        (called_coredns || conf_given).then(|| Self::parse(args.iter().skip(1)))
    }

    /// Go's flag syntax: `-conf FILE`, `-conf=FILE`, with one or two dashes.
    fn parse<'a>(args: impl Iterator<Item = &'a OsString>) -> Result<Self, ArgsError> {
        let mut args = args.map(|arg| {
            arg.to_str()
                .ok_or_else(|| ArgsError::NotUtf8(arg.to_string_lossy().into_owned()))
        });
        let mut conf = None;
        while let Some(arg) = args.next() {
            let arg = arg?;
            let value = match arg {
                "-conf" | "--conf" => args
                    .next()
                    .transpose()?
                    .ok_or_else(|| ArgsError::MissingValue(arg.to_string()))?,
                "-h" | "-help" | "--h" | "--help" => return Ok(Invocation::Help),
                _ => match arg.split_once('=') {
                    Some((flag, value)) if conf_flag(arg) => {
                        if value.is_empty() {
                            return Err(ArgsError::MissingValue(flag.to_string()));
                        }
                        value
                    }
                    _ => return Err(ArgsError::Unsupported(arg.to_string())),
                },
            };
            if conf.replace(PathBuf::from(value)).is_some() {
                return Err(ArgsError::Repeated);
            }
        }
        conf.map(|conf| Invocation::Serve { conf })
            .ok_or(ArgsError::NoConf)
    }
}

/// Where the listeners bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Every address at the Corefile's ports, as CoreDNS: `[::]` (IPv4
    /// too), else `0.0.0.0` where the host has no IPv6.
    Corefile,
    /// `ip` at an ephemeral port for each port of the Corefile (tests).
    Ephemeral(IpAddr),
}

/// A listener of the Corefile: its port there, and the server.
pub struct Listener {
    /// The port the Corefile names (not the bound one with
    /// [`Listen::Ephemeral`]: see [`DnsServer::local_addr`]).
    pub port: u16,
    pub server: DnsServer,
}

/// Binds one server per port of the Corefile, each with the resolver of
/// its server blocks. Serving starts at once.
pub async fn bind(corefile: &Corefile, listen: Listen) -> Result<Vec<Listener>, ServerError> {
    let mut listeners = Vec::new();
    for (port, resolver) in HostsResolver::per_port(corefile) {
        let server = match listen {
            Listen::Ephemeral(ip) => DnsServer::bind(SocketAddr::new(ip, 0), resolver).await?,
            Listen::Corefile => bind_every_address(port, resolver).await?,
        };
        listeners.push(Listener { port, server });
    }
    Ok(listeners)
}

async fn bind_every_address(port: u16, resolver: HostsResolver) -> Result<DnsServer, ServerError> {
    let any_v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
    match DnsServer::bind(any_v6, resolver.clone()).await {
        // No IPv6 on this host (a port taken or forbidden would be so for
        // 0.0.0.0 as well: that error stands).
        Err(ServerError::Bind { source, .. })
            if !matches!(
                source.kind(),
                std::io::ErrorKind::AddrInUse | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            let any_v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            DnsServer::bind(any_v4, resolver).await
        }
        result => result,
    }
}

/// Reads and parses the Corefile at `path`.
pub fn read_corefile(path: &Path) -> Result<Corefile, CorednsError> {
    let text = std::fs::read_to_string(path).map_err(|source| CorednsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Corefile::parse(&text).map_err(|source| CorednsError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Serves the Corefile at `conf` until a signal or a failure.
pub async fn run(conf: &Path) -> Result<(), CorednsError> {
    let corefile = read_corefile(conf)?;
    let listeners = bind(&corefile, Listen::Corefile).await?;
    for block in &corefile.blocks {
        let entries = block.hosts.as_ref().map_or(0, |hosts| hosts.entries.len());
        tracing::info!(
            "serving {}:{} from {} (hosts entries: {entries}; no upstream: names outside the zone are refused)",
            block.zone,
            block.port,
            conf.display(),
        );
    }
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            tracing::info!(
                "listening on {} (UDP and TCP)",
                listener.server.local_addr()
            );
            Box::pin(listener.server.run())
        })
        .collect();
    // Corefile::parse gives at least one block, hence one listener.
    if servers.is_empty() {
        return Err(CorednsError::Parse {
            path: conf.to_path_buf(),
            source: CorefileError::Empty,
        });
    }
    tokio::select! {
        (result, _, _) = futures::future::select_all(servers) => result?,
        result = crate::shutdown_signal() => {
            result.map_err(CorednsError::Signal)?;
            tracing::info!("stopping on signal");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation(args: &[&str]) -> Option<Result<Invocation, ArgsError>> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        Invocation::from_args(&args)
    }

    fn serve(conf: &str) -> Option<Result<Invocation, ArgsError>> {
        Some(Ok(Invocation::Serve {
            conf: PathBuf::from(conf),
        }))
    }

    #[test]
    fn the_conf_flag_in_go_syntax_selects_the_mode() {
        let corefile = "/etc/coredns/Corefile";
        // What the e2e suite runs: command /coredns, args -conf FILE.
        assert_eq!(
            invocation(&["/coredns", "-conf", corefile]),
            serve(corefile)
        );
        assert_eq!(
            invocation(&["/usr/local/bin/flatnet-cluster-dns", "-conf", corefile]),
            serve(corefile)
        );
        assert_eq!(invocation(&["x", "--conf", corefile]), serve(corefile));
        assert_eq!(invocation(&["x", "-conf=/c"]), serve("/c"));
        assert_eq!(invocation(&["x", "--conf=/c=d"]), serve("/c=d"));
    }

    #[test]
    fn without_the_flag_or_the_name_the_cluster_mode_runs() {
        assert_eq!(invocation(&["flatnet-cluster-dns"]), None);
        assert_eq!(
            invocation(&["flatnet-cluster-dns", "--listen", "127.0.0.1:53"]),
            None
        );
        assert_eq!(invocation(&["/bin/corednsx", "--zone", "x"]), None);
        assert_eq!(invocation(&["x", "--config", "y"]), None);
        assert_eq!(invocation(&["x", "-confx"]), None);
    }

    #[test]
    fn called_coredns_its_command_line_is_strict() {
        assert_eq!(invocation(&["coredns"]), Some(Err(ArgsError::NoConf)));
        assert_eq!(
            invocation(&["/coredns", "-help"]),
            Some(Ok(Invocation::Help))
        );
        assert_eq!(invocation(&["coredns", "-h"]), Some(Ok(Invocation::Help)));
        assert_eq!(
            invocation(&["coredns", "-conf"]),
            Some(Err(ArgsError::MissingValue("-conf".into())))
        );
        assert_eq!(
            invocation(&["coredns", "-conf="]),
            Some(Err(ArgsError::MissingValue("-conf".into())))
        );
        assert_eq!(
            invocation(&["coredns", "-conf", "a", "-dns.port", "1053"]),
            Some(Err(ArgsError::Unsupported("-dns.port".into())))
        );
        assert_eq!(
            invocation(&["x", "--listen", "0.0.0.0:53", "-conf", "a"]),
            Some(Err(ArgsError::Unsupported("--listen".into())))
        );
        assert_eq!(
            invocation(&["coredns", "-conf", "a", "Corefile"]),
            Some(Err(ArgsError::Unsupported("Corefile".into())))
        );
        assert_eq!(
            invocation(&["coredns", "-conf", "a", "--conf=b"]),
            Some(Err(ArgsError::Repeated))
        );
    }

    #[test]
    fn reading_names_the_file_and_the_line() {
        let missing = read_corefile(Path::new("/nonexistent/Corefile")).unwrap_err();
        assert!(matches!(missing, CorednsError::Read { .. }));
        assert!(
            missing
                .to_string()
                .starts_with("cannot read the Corefile /nonexistent/Corefile: ")
        );

        let dir = std::env::temp_dir().join(format!("flatnet-coredns-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("Corefile");
        std::fs::write(&path, ". {\n  forward . 8.8.8.8\n}\n").unwrap();
        let unsupported = read_corefile(&path).unwrap_err();
        std::fs::write(
            &path,
            ". {\n\thosts {\n\t\t1.1.1.1 a.example\n\t}\n\tlog\n}",
        )
        .unwrap();
        let served = read_corefile(&path);
        std::fs::remove_dir_all(&dir).unwrap();

        assert!(matches!(
            unsupported,
            CorednsError::Parse {
                source: CorefileError::UnsupportedPlugin { line: 2, .. },
                ..
            }
        ));
        let message = unsupported.to_string();
        assert!(
            message.starts_with(&format!(
                "cannot serve the Corefile {}: line 2: plugin `forward` is not supported",
                path.display()
            )),
            "{message}"
        );
        assert_eq!(served.unwrap().blocks.len(), 1);
    }
}
