//! The Corefile of the CoreDNS mode: the strict subset of CoreDNS's
//! configuration that the e2e suite's DNS server pods use (see the crate
//! doc), parsed without I/O. Anything else is an error naming its line.
//!
//! The syntax kept of Caddy's: one directive a line, `{` ending the line
//! that opens a block and `}` alone on the line that closes it, tokens
//! separated by spaces or tabs, `#` starting a comment. No quotes,
//! environment variables, snippets or imports.

use std::collections::HashMap;
use std::net::IpAddr;

use hickory_server::proto::rr::Name;

use crate::error::CorefileError;

/// CoreDNS's port when a server block names none.
pub const DEFAULT_PORT: u16 = 53;

/// A parsed Corefile: its server blocks in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corefile {
    pub blocks: Vec<ServerBlock>,
}

/// `ZONE[:PORT] { ... }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBlock {
    /// Lowercase and fully qualified; the root (`.`) for every name.
    pub zone: Name,
    pub port: u16,
    /// Where the block opens (for messages).
    pub line: usize,
    /// The `hosts` plugin, if the block has it.
    pub hosts: Option<Hosts>,
    /// The `log` plugin: each query logged to stderr.
    pub log: bool,
    /// The `errors` plugin (nothing to do: no plugin here reports errors).
    pub errors: bool,
}

/// `hosts { ... }`: inline entries only.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hosts {
    pub entries: Vec<HostsEntry>,
    /// A bare `fallthrough`. No plugin follows hosts here, so it changes no
    /// answer (see the crate doc).
    pub fallthrough: bool,
}

/// `IP NAME [NAME...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsEntry {
    pub ip: IpAddr,
    /// Lowercase and fully qualified.
    pub names: Vec<Name>,
}

/// Where the parser is.
enum State {
    /// Between server blocks.
    Top,
    /// Inside a server block.
    Block(ServerBlock),
    /// Inside the hosts block of a server block; its opening line.
    Hosts(ServerBlock, Hosts, usize),
}

/// The tokens of one line, up to a comment.
fn tokens(line: usize, text: &str) -> Result<Vec<&str>, CorefileError> {
    let mut tokens = Vec::new();
    for token in text.split_whitespace() {
        if token.starts_with('#') {
            break;
        }
        let problem = if token.contains(['"', '`', '\'']) {
            Some("quotes are not supported")
        } else if token.contains("{$") {
            Some("environment variables are not supported")
        } else if token != "{" && token != "}" && token.contains(['{', '}']) {
            Some("`{` and `}` must stand apart from other words")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(CorefileError::Syntax {
                line,
                problem: format!("`{token}`: {problem}"),
            });
        }
        tokens.push(token);
    }
    Ok(tokens)
}

fn syntax(line: usize, problem: impl Into<String>) -> CorefileError {
    CorefileError::Syntax {
        line,
        problem: problem.into(),
    }
}

/// `ZONE[:PORT]`, as the key of a server block.
fn server_key(line: usize, key: &str) -> Result<(Name, u16), CorefileError> {
    let invalid = |problem: &str| CorefileError::InvalidKey {
        line,
        key: key.to_string(),
        problem: problem.to_string(),
    };
    if key.contains("://") {
        return Err(invalid(
            "a transport prefix (dns://, tls://, ...) is not supported",
        ));
    }
    if key.contains('/') {
        return Err(invalid("a CIDR (reverse zone) key is not supported"));
    }
    let (zone, port) = match key.rsplit_once(':') {
        Some((zone, port)) => {
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| invalid("the port is not a number from 1 to 65535"))?;
            (zone, port)
        }
        None => (key, DEFAULT_PORT),
    };
    if zone.is_empty() {
        return Err(invalid("no zone (`.` is every name)"));
    }
    Ok((domain_name(zone).map_err(|e| invalid(&e))?, port))
}

/// A domain name as written (any case, a trailing dot optional):
/// lowercase, fully qualified.
fn domain_name(text: &str) -> Result<Name, String> {
    let mut name = Name::from_ascii(text).map_err(|e| format!("not a domain name: {e}"))?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

/// One line of a hosts block: an entry or `fallthrough`.
fn hosts_line(line: usize, tokens: &[&str], hosts: &mut Hosts) -> Result<(), CorefileError> {
    if tokens.iter().any(|token| matches!(*token, "{" | "}")) {
        return Err(syntax(
            line,
            format!(
                "unexpected brace in `{}`: `}}` stands alone on the line closing `hosts {{`",
                tokens.join(" ")
            ),
        ));
    }
    let first = tokens[0];
    if first == "fallthrough" {
        if tokens.len() > 1 {
            return Err(CorefileError::UnsupportedHostsOption {
                line,
                option: tokens.join(" "),
            });
        }
        hosts.fallthrough = true;
        return Ok(());
    }
    let invalid = |problem: String| CorefileError::InvalidHostsEntry {
        line,
        text: tokens.join(" "),
        problem,
    };
    let Ok(ip) = first.parse::<IpAddr>() else {
        if matches!(first, "ttl" | "no_reverse" | "reload") {
            return Err(CorefileError::UnsupportedHostsOption {
                line,
                option: tokens.join(" "),
            });
        }
        return Err(invalid(format!("`{first}` is not an IP address")));
    };
    if tokens.len() < 2 {
        return Err(invalid("no name".to_string()));
    }
    let names = tokens[1..]
        .iter()
        .map(|text| domain_name(text).map_err(|e| invalid(format!("`{text}`: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    hosts.entries.push(HostsEntry { ip, names });
    Ok(())
}

/// What a line of a server block leads to.
enum Step {
    /// The block goes on.
    Same(ServerBlock),
    /// A hosts block opens.
    Hosts(ServerBlock),
    /// The block is closed.
    Closed(ServerBlock),
}

/// One line of a server block: a plugin, or the block's end.
fn block_line(line: usize, tokens: &[&str], mut block: ServerBlock) -> Result<Step, CorefileError> {
    let plugin = tokens[0];
    let arguments = &tokens[1..];
    let opened = block.line;
    let once = |present: bool| {
        if present {
            Err(syntax(
                line,
                format!("`{plugin}` is given twice in the block of line {opened}"),
            ))
        } else {
            Ok(())
        }
    };
    match plugin {
        "}" if arguments.is_empty() => return Ok(Step::Closed(block)),
        "hosts" => {
            once(block.hosts.is_some())?;
            let opens = arguments.last() == Some(&"{");
            let arguments = if opens {
                &arguments[..arguments.len() - 1]
            } else {
                arguments
            };
            if !arguments.is_empty() {
                return Err(CorefileError::HostsArguments {
                    line,
                    arguments: arguments.join(" "),
                });
            }
            if !opens {
                return Err(syntax(
                    line,
                    "`hosts` without a block would read /etc/hosts, which is not \
                     supported: give the entries inline in `hosts {` ... `}`",
                ));
            }
            return Ok(Step::Hosts(block));
        }
        "log" | "errors" => {
            let present = if plugin == "log" {
                block.log
            } else {
                block.errors
            };
            once(present)?;
            if !arguments.is_empty() {
                return Err(syntax(
                    line,
                    format!(
                        "`{plugin}` takes no arguments nor block here (got `{}`)",
                        arguments.join(" ")
                    ),
                ));
            }
            if plugin == "log" {
                block.log = true;
            } else {
                block.errors = true;
            }
        }
        "{" | "}" => return Err(syntax(line, format!("unexpected `{}`", tokens.join(" ")))),
        _ => {
            return Err(CorefileError::UnsupportedPlugin {
                line,
                plugin: plugin.to_string(),
            });
        }
    }
    Ok(Step::Same(block))
}

impl Corefile {
    /// Parses the text of a Corefile.
    pub fn parse(text: &str) -> Result<Self, CorefileError> {
        let mut blocks: Vec<ServerBlock> = Vec::new();
        // (zone, port) -> the line of the block serving it.
        let mut served: HashMap<(Name, u16), usize> = HashMap::new();
        let mut state = State::Top;
        for (index, text) in text.lines().enumerate() {
            let line = index + 1;
            let tokens = tokens(line, text)?;
            if tokens.is_empty() {
                continue;
            }
            state = match state {
                State::Top => {
                    let [key, "{"] = tokens[..] else {
                        let problem = match tokens[..] {
                            [.., "{"] if tokens.len() > 2 => {
                                "one zone per server block is supported".to_string()
                            }
                            ["{"] => "a server block needs a zone before `{`".to_string(),
                            _ => format!(
                                "expected a server block `ZONE[:PORT] {{`, got `{}`",
                                tokens.join(" ")
                            ),
                        };
                        return Err(syntax(line, problem));
                    };
                    let (zone, port) = server_key(line, key)?;
                    if let Some(first) = served.insert((zone.clone(), port), line) {
                        return Err(CorefileError::DuplicateZone {
                            line,
                            zone: zone.to_string(),
                            port,
                            first,
                        });
                    }
                    State::Block(ServerBlock {
                        zone,
                        port,
                        line,
                        hosts: None,
                        log: false,
                        errors: false,
                    })
                }
                State::Block(block) => match block_line(line, &tokens, block)? {
                    Step::Same(block) => State::Block(block),
                    Step::Hosts(block) => State::Hosts(block, Hosts::default(), line),
                    Step::Closed(block) => {
                        blocks.push(block);
                        State::Top
                    }
                },
                State::Hosts(mut block, mut hosts, opened) => {
                    if tokens == ["}"] {
                        block.hosts = Some(hosts);
                        State::Block(block)
                    } else {
                        hosts_line(line, &tokens, &mut hosts)?;
                        State::Hosts(block, hosts, opened)
                    }
                }
            };
        }
        match state {
            State::Top => {}
            State::Block(block) => return Err(CorefileError::Unclosed { line: block.line }),
            State::Hosts(_, _, opened) => return Err(CorefileError::Unclosed { line: opened }),
        }
        if blocks.is_empty() {
            return Err(CorefileError::Empty);
        }
        Ok(Corefile { blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `generateCoreDNSConfigmap` (test/e2e/network/dns_common.go of
    /// Kubernetes 1.20) writes for "DNS should support configurable pod
    /// resolv.conf": tabs, no newline at the end.
    const E2E_COREFILE: &str =
        ". {\n\thosts {\n\t\t1.1.1.1 notexistname.resolv.conf.local\n\t}\n\tlog\n}";

    fn name(text: &str) -> Name {
        Name::from_ascii(text).unwrap()
    }

    fn error_of(text: &str) -> CorefileError {
        Corefile::parse(text).unwrap_err()
    }

    #[test]
    fn the_e2e_corefile_parses() {
        let corefile = Corefile::parse(E2E_COREFILE).unwrap();
        assert_eq!(
            corefile,
            Corefile {
                blocks: vec![ServerBlock {
                    zone: Name::root(),
                    port: 53,
                    line: 1,
                    hosts: Some(Hosts {
                        entries: vec![HostsEntry {
                            ip: "1.1.1.1".parse().unwrap(),
                            names: vec![name("notexistname.resolv.conf.local.")],
                        }],
                        fallthrough: false,
                    }),
                    log: true,
                    errors: false,
                }],
            }
        );
        assert!(corefile.blocks[0].zone.is_fqdn());
    }

    /// The dns_configmap.go servers: several entries (in map order), IPv6
    /// ones, and none at all.
    #[test]
    fn the_e2e_corefiles_with_several_entries_or_none_parse() {
        let corefile = Corefile::parse(
            ". {\n\thosts {\n\t\t2606:4700:4700::2222 def.acme.local\n\t\t2606:4700:4700::3333 widget.local\
             \n\t\t2606:4700:4700::1111 abc.acme.local\n\t}\n\tlog\n}",
        )
        .unwrap();
        let hosts = corefile.blocks[0].hosts.as_ref().unwrap();
        let entries: Vec<(String, String)> = hosts
            .entries
            .iter()
            .map(|e| (e.ip.to_string(), e.names[0].to_string()))
            .collect();
        assert_eq!(
            entries,
            [
                ("2606:4700:4700::2222".into(), "def.acme.local.".into()),
                ("2606:4700:4700::3333".into(), "widget.local.".into()),
                ("2606:4700:4700::1111".into(), "abc.acme.local.".into()),
            ]
        );

        let empty = Corefile::parse(". {\n\thosts {\n\t}\n\tlog\n}").unwrap();
        assert_eq!(empty.blocks[0].hosts, Some(Hosts::default()));
    }

    #[test]
    fn ports_zones_several_names_comments_fallthrough_and_errors() {
        let corefile = Corefile::parse(
            "# a comment\n\
             \n\
             Example.ORG.:1053 {   # the test zone\n\
             \x20   errors\n\
             \x20   hosts {\n\
             \x20       # inline entries\n\
             \x20       10.0.0.1 One.Example.org two.example.org.\n\
             \x20       fd00::1  one.example.org\n\
             \x20       fallthrough\n\
             \x20   }\n\
             }\n\
             .:53 {\n\
             \x20   log\n\
             }\n",
        )
        .unwrap();
        let [first, second] = &corefile.blocks[..] else {
            panic!("two blocks: {corefile:?}");
        };
        assert_eq!(first.zone, name("example.org."));
        assert_eq!(first.zone.to_string(), "example.org.");
        assert_eq!((first.port, first.line), (1053, 3));
        assert!(first.errors && !first.log);
        let hosts = first.hosts.as_ref().unwrap();
        assert!(hosts.fallthrough);
        assert_eq!(
            hosts.entries[0].names,
            [name("one.example.org."), name("two.example.org.")]
        );
        assert_eq!(hosts.entries[0].names[0].to_string(), "one.example.org.");
        assert_eq!(hosts.entries[1].ip, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(
            (second.zone.is_root(), second.port, second.line),
            (true, 53, 12)
        );
        assert!(second.log && second.hosts.is_none());
    }

    #[test]
    fn an_unsupported_plugin_is_named_with_its_line() {
        let error = error_of(". {\n\thosts {\n\t}\n\tforward . 8.8.8.8\n\tlog\n}");
        assert!(
            matches!(&error, CorefileError::UnsupportedPlugin { line: 4, plugin } if plugin == "forward"),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.starts_with("line 4: plugin `forward` is not supported; supported: "));
        assert!(message.contains("`hosts`") && message.contains("`log`"));

        for plugin in [
            "kubernetes cluster.local",
            "cache 30",
            "health",
            "ready",
            "import x",
        ] {
            let error = error_of(&format!(".:53 {{\n    {plugin}\n}}\n"));
            assert!(
                matches!(&error, CorefileError::UnsupportedPlugin { line: 2, .. }),
                "{plugin}: {error:?}"
            );
        }
    }

    #[test]
    fn hosts_files_zones_and_options_are_refused() {
        let error = error_of(". {\n  hosts /etc/hosts {\n  }\n}");
        assert!(
            matches!(&error, CorefileError::HostsArguments { line: 2, arguments } if arguments == "/etc/hosts"),
            "{error:?}"
        );
        assert!(error.to_string().contains("only inline entries"));
        assert!(matches!(
            error_of(". {\n  hosts /etc/hosts example.org\n}"),
            CorefileError::HostsArguments { line: 2, .. }
        ));
        // Bare `hosts` reads /etc/hosts in CoreDNS.
        let error = error_of(". {\n  hosts\n}");
        assert!(
            matches!(error, CorefileError::Syntax { line: 2, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("/etc/hosts"));
        for option in [
            "ttl 60",
            "no_reverse",
            "reload 10s",
            "fallthrough example.org",
        ] {
            let error = error_of(&format!(". {{\n  hosts {{\n    {option}\n  }}\n}}"));
            assert!(
                matches!(&error, CorefileError::UnsupportedHostsOption { line: 3, option: o } if o == option),
                "{option}: {error:?}"
            );
        }
    }

    #[test]
    fn bad_hosts_entries_are_refused() {
        for (entry, problem) in [
            ("1.1.1.1", "no name"),
            ("1.1.1.300 a.example", "not an IP address"),
            ("fe80::1%eth0 a.example", "not an IP address"),
            ("a.example 1.1.1.1", "not an IP address"),
            ("1.1.1.1 a..example", "not a domain name"),
        ] {
            let error = error_of(&format!(". {{\n  hosts {{\n    {entry}\n  }}\n}}"));
            assert!(
                matches!(&error, CorefileError::InvalidHostsEntry { line: 3, text, .. } if text == entry),
                "{entry}: {error:?}"
            );
            assert!(error.to_string().contains(problem), "{entry}: {error}");
        }
    }

    #[test]
    fn bad_keys_are_refused() {
        for key in [
            "dns://.:53",
            "10.0.0.0/24",
            ".:0",
            ".:65536",
            ".:dns",
            ":53",
            "a..b",
        ] {
            let error = error_of(&format!("{key} {{\n}}"));
            assert!(
                matches!(&error, CorefileError::InvalidKey { line: 1, key: k, .. } if k == key),
                "{key}: {error:?}"
            );
        }
    }

    #[test]
    fn other_syntax_is_refused_with_its_line() {
        let syntax_line = |text: &str| match error_of(text) {
            CorefileError::Syntax { line, .. } => line,
            other => panic!("{text:?}: {other:?}"),
        };
        // Several keys, no braces, a lone brace, braces glued to words.
        assert_eq!(syntax_line("example.org example.net {\n}"), 1);
        assert_eq!(syntax_line(".\nhosts {\n}"), 1);
        assert_eq!(syntax_line("{\n}"), 1);
        assert_eq!(syntax_line(". {}\n"), 1);
        assert_eq!(syntax_line(". {\n  log\n}}"), 3);
        assert_eq!(
            syntax_line(". {\n  hosts {\n    1.1.1.1 a.example }\n  }\n}"),
            3
        );
        // Quotes, environment variables, arguments to log and errors.
        assert_eq!(syntax_line(". {\n  log \"{remote}\"\n}"), 2);
        assert_eq!(syntax_line("{$ZONE} {\n}"), 1);
        assert_eq!(syntax_line(". {\n  log . {\n  }\n}"), 2);
        assert_eq!(syntax_line(". {\n  errors stdout\n}"), 2);
        // Twice the same plugin in a block.
        assert_eq!(syntax_line(". {\n  log\n  log\n}"), 3);
        assert_eq!(syntax_line(". {\n  hosts {\n  }\n  hosts {\n  }\n}"), 4);
        // Something after a closing brace.
        assert_eq!(syntax_line(". {\n} extra"), 2);
        assert!(
            error_of(". {\n  log\n}}")
                .to_string()
                .contains("supported: ")
        );
    }

    #[test]
    fn unclosed_blocks_empty_files_and_duplicate_zones_are_refused() {
        assert!(matches!(
            error_of(". {\n  log\n"),
            CorefileError::Unclosed { line: 1 }
        ));
        assert!(matches!(
            error_of(". {\n  hosts {\n    1.1.1.1 a\n}"),
            CorefileError::Unclosed { line: 1 }
        ));
        assert!(matches!(
            error_of(". {\n  log\n  hosts {\n    1.1.1.1 a\n"),
            CorefileError::Unclosed { line: 3 }
        ));
        assert!(matches!(error_of(""), CorefileError::Empty));
        assert!(matches!(
            error_of("# nothing\n\n   \t\n"),
            CorefileError::Empty
        ));
        assert!(matches!(
            error_of(". {\n}\n.:53 {\n}"),
            CorefileError::DuplicateZone {
                line: 3,
                port: 53,
                first: 1,
                ..
            }
        ));
        // The same zone on another port is another server.
        assert_eq!(
            Corefile::parse(". {\n}\n.:5353 {\n}").unwrap().blocks.len(),
            2
        );
    }
}
