//! flatnet-ipam: an IPAM plugin any CNI plugin can delegate to.
//!
//! `config` validates the `ipam` section into an address plan, `allocator`
//! picks addresses (pure logic), `store` keeps one record per allocation on
//! disk, crash-safe and under a file lock. The verbs below tie them together
//! over the [`AllocationStore`] trait; [`PLUGIN`] plugs them into the shared
//! runner. No async runtime: an ADD is a handful of file system calls.

pub mod allocator;
pub mod config;
pub mod store;

use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use config::IpamConf;
use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::error::{Error, Result};
use flatnet_cni::result::{CniResult, IpConfig};
use flatnet_cni::runner::{Output, Plugin, Report};
use flatnet_cni::runtime::require_valid_attachments;
use store::{AllocationStore, DiskStore, Record};

/// The `flatnet-ipam` binary.
pub const PLUGIN: Plugin = Plugin {
    name: "flatnet-ipam",
    log_tag: "flatnet-ipam ",
    dispatch,
};

fn dispatch(command: Command, env: &CniEnv, stdin: &[u8], report: &mut Report) -> Result<Output> {
    let parsed = IpamConf::read(stdin)?;
    report.cni_version = parsed.version.as_str().to_string();
    report.log_file = parsed.log_file.clone();
    let conf = parsed.validate()?;
    // Refused before the store is touched.
    conf.version.require_verb(command)?;
    if matches!(command, Command::Add | Command::Check) {
        // The keys a delegating flatnet knows too (it shares CNI_ARGS with us).
        flatnet_cni::runtime::check_cni_args(&env.args, flatnet_cni::runtime::FLATNET_CNI_ARGS)?;
    }
    let requested = match command {
        Command::Add => requested_ips(env, &conf)?,
        _ => Vec::new(),
    };
    // Verbs that only read or release do not create a store that is not there.
    if command != Command::Add && !conf.dir.exists() {
        return match command {
            Command::Check => Err(Error::CheckMismatch(format!(
                "container {} ({}) holds no address: {} does not exist",
                env.container_id,
                env.ifname,
                conf.dir.display()
            ))),
            _ => Ok(Output::Nothing),
        };
    }
    let mut store = DiskStore::open(&conf.dir, conf.fsync)?;
    match command {
        Command::Add => {
            let result = add(
                &mut store,
                &conf,
                &env.container_id,
                &env.ifname,
                &requested,
            )?;
            Ok(Output::Json(result.to_version(conf.version)))
        }
        Command::Del => del(&mut store, &env.container_id, &env.ifname).map(|()| Output::Nothing),
        Command::Check => {
            check(&mut store, &conf, &env.container_id, &env.ifname).map(|()| Output::Nothing)
        }
        Command::Status => status(&mut store, &conf).map(|()| Output::Nothing),
        Command::Gc => gc(&mut store, &conf).map(|()| Output::Nothing),
        // The runner answers VERSION itself; answering here too costs nothing.
        Command::Version => Ok(Output::Json(
            serde_json::to_value(flatnet_cni::version::version_info(stdin)?).unwrap_or_default(),
        )),
    }
}

/// CNI_ARGS `IP=a,b` and the config's `args.cni.ips` / `runtimeConfig.ips`.
fn requested_ips(env: &CniEnv, conf: &IpamConf) -> Result<Vec<IpAddr>> {
    let mut ips = conf.requested.clone();
    if let Some(list) = env.arg("IP") {
        for text in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let ip = text.split_once('/').map_or(text, |(ip, _)| ip);
            ips.push(ip.parse().map_err(|_| {
                Error::invalid_env(
                    "CNI_ARGS",
                    format!("IP={list}: {text:?} is not an IP address; use IP=10.42.0.5 or IP=10.42.0.5,fd00::5"),
                )
            })?);
        }
    }
    let mut seen = HashSet::new();
    ips.retain(|ip| seen.insert(*ip));
    Ok(ips)
}

fn describe_set(conf: &IpamConf, set: usize) -> String {
    let ranges = conf
        .plan
        .sets
        .get(set)
        .map(ToString::to_string)
        .unwrap_or_default();
    format!("range set {set} [{ranges}]")
}

fn taken_message(ip: IpAddr, owner: Option<Record>) -> String {
    match owner {
        Some(owner) => format!(
            "{ip} is already allocated to container {} ({}); request a free address or release it first",
            owner.container_id, owner.ifname
        ),
        None => format!(
            "{ip} is already in use (its file in the data dir is not a readable record); request another address"
        ),
    }
}

/// ADD: the addresses the attachment already holds, or new ones, one per
/// range set; what this call reserved is given back when it fails half way.
pub fn add<S: AllocationStore>(
    store: &mut S,
    conf: &IpamConf,
    container_id: &str,
    ifname: &str,
    requested: &[IpAddr],
) -> Result<CniResult> {
    let plan = &conf.plan;
    let mut wanted: Vec<Option<IpAddr>> = vec![None; plan.sets.len()];
    for &ip in requested {
        let set = plan.locate(ip).map_err(|refusal| {
            Error::config(format!(
                "requested address {ip} {refusal}; choose one inside {}",
                (0..plan.sets.len())
                    .map(|s| describe_set(conf, s))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ))
        })?;
        if let Some(other) = wanted[set] {
            return Err(Error::config(format!(
                "requested addresses {other} and {ip} both fall in {}; ask for one address per range set",
                describe_set(conf, set)
            )));
        }
        wanted[set] = Some(ip);
    }
    let held = store.held_by(container_id, ifname)?;
    let mut fresh: Vec<Record> = Vec::new();
    let outcome = (|| -> Result<Vec<IpAddr>> {
        let mut chosen = Vec::with_capacity(plan.sets.len());
        for (set, want) in wanted.iter().enumerate() {
            // A repeated ADD: what the attachment holds already (if the config still covers it).
            if let Some(&(_, ip)) = held
                .iter()
                .find(|(s, ip)| *s == set && plan.allocatable_in(set, *ip))
            {
                if let Some(want) = want
                    && *want != ip
                {
                    return Err(Error::AddressTaken(format!(
                        "container {container_id} ({ifname}) already holds {ip} in {}; DEL it before asking for {want}",
                        describe_set(conf, set)
                    )));
                }
                chosen.push(ip);
                continue;
            }
            let mut record = Record {
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                address: IpAddr::from([0, 0, 0, 0]),
                range_set: set,
            };
            if let Some(want) = want {
                record.address = *want;
                if !store.reserve(&record)? {
                    return Err(Error::AddressTaken(taken_message(
                        *want,
                        store.owner(*want),
                    )));
                }
            } else {
                loop {
                    let last = store.last_reserved(set);
                    let Some(ip) = plan.next_free(set, last, |ip| store.is_taken(ip)) else {
                        return Err(Error::PoolExhausted(format!(
                            "no free address in {}: all {} addresses it can hand out are allocated; widen the range or release addresses (DEL, GC)",
                            describe_set(conf, set),
                            plan.capacity(set)
                        )));
                    };
                    record.address = ip;
                    // False only when a file appeared at that name behind the lock's back.
                    if store.reserve(&record)? {
                        break;
                    }
                }
            }
            store.set_last_reserved(set, record.address)?;
            chosen.push(record.address);
            fresh.push(record);
        }
        store.commit()?;
        Ok(chosen)
    })();
    let chosen = match outcome {
        Ok(chosen) => chosen,
        Err(err) => {
            // Only this call's records: what the attachment held before stays.
            for record in &fresh {
                if let Err(e) = store.unreserve(record) {
                    eprintln!(
                        "flatnet-ipam: giving back {} after a failed ADD: {e}",
                        record.address
                    );
                }
            }
            if !fresh.is_empty() {
                let _ = store.commit();
            }
            return Err(err);
        }
    };
    let mut result = CniResult {
        routes: conf.routes.clone(),
        dns: conf.dns.clone(),
        ..Default::default()
    };
    for (set, ip) in chosen.into_iter().enumerate() {
        let range = plan
            .range_of(set, ip)
            .ok_or_else(|| Error::Store(format!("{ip} is outside {}", describe_set(conf, set))))?;
        let address = IpNetwork::new(ip, range.subnet.prefix())
            .map_err(|e| Error::Store(format!("{ip}/{}: {e}", range.subnet.prefix())))?;
        result.ips.push(IpConfig {
            version: None,
            address,
            gateway: Some(range.gateway),
            interface: None,
        });
    }
    Ok(result)
}

/// DEL: releases what the attachment holds; nothing held is fine.
pub fn del<S: AllocationStore>(store: &mut S, container_id: &str, ifname: &str) -> Result<()> {
    store.release(container_id, ifname)?;
    store.commit()
}

/// CHECK: the attachment holds an address in every range set, and the
/// addresses of prevResult (if given) that belong to this plan are its own.
pub fn check<S: AllocationStore>(
    store: &mut S,
    conf: &IpamConf,
    container_id: &str,
    ifname: &str,
) -> Result<()> {
    let held = store.held_by(container_id, ifname)?;
    for set in 0..conf.plan.sets.len() {
        if !held
            .iter()
            .any(|(s, ip)| *s == set && conf.plan.allocatable_in(set, *ip))
        {
            return Err(Error::CheckMismatch(format!(
                "container {container_id} ({ifname}) holds no address in {}",
                describe_set(conf, set)
            )));
        }
    }
    if let Some(prev) = &conf.prev_result {
        for ip in &prev.ips {
            let address = ip.address.ip();
            let ours = conf
                .plan
                .sets
                .iter()
                .any(|set| set.range_of(address).is_some());
            if ours && !held.iter().any(|(_, held)| *held == address) {
                return Err(Error::CheckMismatch(format!(
                    "prevResult has {address}, but container {container_id} ({ifname}) holds {}",
                    held.iter()
                        .map(|(_, ip)| ip.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// STATUS: ready while every range set has a free address.
pub fn status<S: AllocationStore>(store: &mut S, conf: &IpamConf) -> Result<()> {
    for set in 0..conf.plan.sets.len() {
        if conf
            .plan
            .next_free(set, None, |ip| store.is_taken(ip))
            .is_none()
        {
            return Err(Error::NotReady(format!(
                "{} is full: all {} addresses it can hand out are allocated; ADD would fail",
                describe_set(conf, set),
                conf.plan.capacity(set)
            )));
        }
    }
    Ok(())
}

/// GC: releases every allocation whose attachment is not listed as valid,
/// going on past failures and reporting them together at the end.
pub fn gc<S: AllocationStore>(store: &mut S, conf: &IpamConf) -> Result<()> {
    let valid_list = require_valid_attachments(conf.valid_attachments.clone())?;
    let valid: HashSet<(&str, &str)> = valid_list
        .iter()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let mut stale: Vec<(String, String)> = store
        .records()?
        .into_iter()
        .filter(|r| !valid.contains(&(r.container_id.as_str(), r.ifname.as_str())))
        .map(|r| (r.container_id, r.ifname))
        .collect();
    stale.sort();
    stale.dedup();
    let mut failures = Vec::new();
    for (id, ifname) in &stale {
        if let Err(e) = store.release(id, ifname) {
            eprintln!("flatnet-ipam: GC of {id} ({ifname}) failed: {e}");
            failures.push(format!("{id} ({ifname}): {e}"));
        }
    }
    let committed = store.commit();
    if !failures.is_empty() {
        return Err(Error::Store(format!(
            "GC released {} of {} stale attachments; failed: {}",
            stale.len() - failures.len(),
            stale.len(),
            failures.join("; ")
        )));
    }
    committed
}

#[cfg(test)]
mod tests {
    use super::*;
    use flatnet_cni::runtime::Attachment;
    use flatnet_cni::version::SpecVersion;
    use serde_json::json;
    use store::MemoryStore;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn conf(ipam: serde_json::Value) -> IpamConf {
        IpamConf::parse(
            json!({"cniVersion": "1.1.0", "name": "n", "ipam": ipam})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    fn small() -> IpamConf {
        conf(
            json!({"type": "flatnet-ipam", "subnet": "10.0.0.0/29", "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.53"]}}),
        )
    }

    fn dual() -> IpamConf {
        conf(
            json!({"type": "flatnet-ipam", "ranges": [[{"subnet": "10.0.0.0/29"}], [{"subnet": "fd00::/125"}]]}),
        )
    }

    fn addresses(result: &CniResult) -> Vec<String> {
        result.ips.iter().map(|ip| ip.address.to_string()).collect()
    }

    #[test]
    fn add_gives_an_address_with_prefix_gateway_routes_and_dns() {
        let mut store = MemoryStore::default();
        let r = add(&mut store, &small(), "a", "eth0", &[]).unwrap();
        assert_eq!(addresses(&r), vec!["10.0.0.2/29"]);
        assert_eq!(r.ips[0].gateway, Some(ip("10.0.0.1")));
        assert_eq!(r.routes.len(), 1);
        assert_eq!(r.dns.nameservers, vec!["10.0.0.53"]);
        assert!(r.interfaces.is_empty());
        let json = r.to_version(SpecVersion::V1_0_0);
        assert!(json.get("interfaces").is_none());
        assert!(json["ips"][0].get("interface").is_none());
        assert_eq!(store.commits, 1);
    }

    #[test]
    fn a_repeated_add_returns_the_same_addresses() {
        let mut store = MemoryStore::default();
        let first = add(&mut store, &dual(), "a", "eth0", &[]).unwrap();
        assert_eq!(addresses(&first), vec!["10.0.0.2/29", "fd00::2/125"]);
        let again = add(&mut store, &dual(), "a", "eth0", &[]).unwrap();
        assert_eq!(first, again);
        assert_eq!(store.records.len(), 2);
        let other = add(&mut store, &dual(), "a", "eth1", &[]).unwrap();
        assert_eq!(addresses(&other), vec!["10.0.0.3/29", "fd00::3/125"]);
    }

    #[test]
    fn a_half_done_dual_stack_add_is_completed() {
        let mut store = MemoryStore::default();
        store
            .reserve(&Record {
                container_id: "a".into(),
                ifname: "eth0".into(),
                address: ip("10.0.0.5"),
                range_set: 0,
            })
            .unwrap();
        let r = add(&mut store, &dual(), "a", "eth0", &[]).unwrap();
        assert_eq!(addresses(&r), vec!["10.0.0.5/29", "fd00::2/125"]);
    }

    #[test]
    fn del_releases_only_that_attachment_and_the_walk_moves_on() {
        let mut store = MemoryStore::default();
        let c = small();
        add(&mut store, &c, "a", "eth0", &[]).unwrap();
        add(&mut store, &c, "b", "eth0", &[]).unwrap();
        del(&mut store, "a", "eth0").unwrap();
        del(&mut store, "a", "eth0").unwrap();
        assert_eq!(store.records.len(), 1);
        // 10.0.0.2 was released but the walk goes on from .3.
        let r = add(&mut store, &c, "c", "eth0", &[]).unwrap();
        assert_eq!(addresses(&r), vec!["10.0.0.4/29"]);
    }

    #[test]
    fn requested_addresses_are_honoured_or_refused() {
        let mut store = MemoryStore::default();
        let c = dual();
        let r = add(&mut store, &c, "a", "eth0", &[ip("10.0.0.6")]).unwrap();
        assert_eq!(addresses(&r), vec!["10.0.0.6/29", "fd00::2/125"]);
        // The same request again from the same attachment is fine.
        add(&mut store, &c, "a", "eth0", &[ip("10.0.0.6")]).unwrap();
        let err = add(&mut store, &c, "b", "eth0", &[ip("10.0.0.6")]).unwrap_err();
        assert_eq!(err.code(), 111);
        assert!(
            err.to_string()
                .contains("already allocated to container a (eth0)"),
            "{err}"
        );
        let err = add(&mut store, &c, "a", "eth0", &[ip("10.0.0.5")]).unwrap_err();
        assert_eq!(err.code(), 111);
        assert!(err.to_string().contains("already holds 10.0.0.6"), "{err}");
        for (bad, why) in [
            ("10.0.0.1", "gateway"),
            ("10.0.0.7", "broadcast"),
            ("10.9.0.2", "not inside any configured range"),
        ] {
            let err = add(&mut store, &c, "z", "eth0", &[ip(bad)]).unwrap_err();
            assert_eq!(err.code(), 7, "{bad}");
            assert!(err.to_string().contains(why), "{err}");
        }
        let err = add(
            &mut store,
            &c,
            "z",
            "eth0",
            &[ip("10.0.0.2"), ip("10.0.0.3")],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("one address per range set"),
            "{err}"
        );
        let r = add(
            &mut store,
            &c,
            "d",
            "eth0",
            &[ip("fd00::7"), ip("10.0.0.3")],
        )
        .unwrap();
        assert_eq!(addresses(&r), vec!["10.0.0.3/29", "fd00::7/125"]);
    }

    #[test]
    fn a_full_pool_names_the_range_and_its_size_and_rolls_back() {
        let mut store = MemoryStore::default();
        let c = dual();
        for i in 0..4 {
            add(&mut store, &c, &format!("c{i}"), "eth0", &[]).unwrap();
        }
        assert!(status(&mut store, &c).is_ok());
        add(&mut store, &c, "c5", "eth0", &[]).unwrap();
        let err = add(&mut store, &c, "c6", "eth0", &[]).unwrap_err();
        assert_eq!(err.code(), 110);
        let msg = err.to_string();
        assert!(
            msg.contains("range set 0 [10.0.0.0/29 (10.0.0.1-10.0.0.6)]"),
            "{msg}"
        );
        assert!(msg.contains("all 5 addresses"), "{msg}");
        let err = status(&mut store, &c).unwrap_err();
        assert_eq!(err.code(), 50);
        // Fill only the IPv6 side: the IPv4 address taken first is given back.
        let mut store = MemoryStore::default();
        for i in 2..8 {
            store.foreign.insert(ip(&format!("fd00::{i}")));
        }
        let err = add(&mut store, &c, "x", "eth0", &[]).unwrap_err();
        assert!(err.to_string().contains("range set 1"), "{err}");
        assert!(store.records.is_empty(), "{:?}", store.records);
    }

    #[test]
    fn a_failed_add_keeps_what_the_attachment_held_before() {
        let mut store = MemoryStore::default();
        let c = dual();
        store
            .reserve(&Record {
                container_id: "a".into(),
                ifname: "eth0".into(),
                address: ip("fd00::5"),
                range_set: 1,
            })
            .unwrap();
        store.foreign.insert(ip("10.0.0.4"));
        let err = add(&mut store, &c, "a", "eth0", &[ip("10.0.0.4")]).unwrap_err();
        assert_eq!(err.code(), 111);
        assert!(err.to_string().contains("not a readable record"), "{err}");
        assert_eq!(
            store.held_by("a", "eth0").unwrap(),
            vec![(1, ip("fd00::5"))]
        );
    }

    #[test]
    fn check_finds_missing_and_foreign_addresses() {
        let mut store = MemoryStore::default();
        let c = dual();
        let err = check(&mut store, &c, "a", "eth0").unwrap_err();
        assert_eq!(err.code(), 102);
        let r = add(&mut store, &c, "a", "eth0", &[]).unwrap();
        check(&mut store, &c, "a", "eth0").unwrap();
        let mut with_prev = c.clone();
        with_prev.prev_result = Some(r.clone());
        check(&mut store, &with_prev, "a", "eth0").unwrap();
        let mut wrong = r;
        wrong.ips[0].address = "10.0.0.6/29".parse().unwrap();
        with_prev.prev_result = Some(wrong);
        let err = check(&mut store, &with_prev, "a", "eth0").unwrap_err();
        assert!(err.to_string().contains("prevResult has 10.0.0.6"), "{err}");
    }

    fn attachment(container_id: &str, ifname: &str) -> Attachment {
        Attachment {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn gc_without_the_valid_list_is_refused_and_releases_nothing() {
        let mut store = MemoryStore::default();
        let c = small();
        add(&mut store, &c, "a", "eth0", &[]).unwrap();
        let err = gc(&mut store, &c).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("valid-attachments"), "{err}");
        assert_eq!(store.records.len(), 1);
    }

    #[test]
    fn gc_keeps_valid_attachments_only() {
        let mut store = MemoryStore::default();
        let mut c = dual();
        for id in ["a", "b", "c"] {
            add(&mut store, &c, id, "eth0", &[]).unwrap();
        }
        add(&mut store, &c, "a", "eth1", &[]).unwrap();
        c.valid_attachments = Some(vec![attachment("a", "eth0"), attachment("c", "eth0")]);
        gc(&mut store, &c).unwrap();
        let mut left: Vec<_> = store
            .records
            .iter()
            .map(|r| (r.container_id.clone(), r.ifname.clone()))
            .collect();
        left.dedup();
        assert_eq!(
            left,
            vec![("a".into(), "eth0".into()), ("c".into(), "eth0".into())]
        );
        c.valid_attachments = Some(Vec::new());
        gc(&mut store, &c).unwrap();
        assert!(store.records.is_empty());
    }

    #[test]
    fn gc_goes_on_past_a_failure_and_reports_it() {
        let mut store = MemoryStore::default();
        let mut c = small();
        for id in ["a", "b", "c"] {
            add(&mut store, &c, id, "eth0", &[]).unwrap();
        }
        store.fail_release.insert("b".into());
        c.valid_attachments = Some(Vec::new());
        let err = gc(&mut store, &c).unwrap_err();
        assert_eq!(err.code(), 112);
        assert!(err.to_string().contains("released 2 of 3"), "{err}");
        assert!(err.to_string().contains("b (eth0)"), "{err}");
        let left: Vec<&str> = store
            .records
            .iter()
            .map(|r| r.container_id.as_str())
            .collect();
        assert_eq!(left, vec!["b"]);
    }

    #[test]
    fn cni_args_ip_accepts_lists_and_refuses_garbage() {
        let c = dual();
        let env = CniEnv {
            args: vec![("IP".into(), "10.0.0.3, fd00::3/64".into())],
            ..Default::default()
        };
        assert_eq!(
            requested_ips(&env, &c).unwrap(),
            vec![ip("10.0.0.3"), ip("fd00::3")]
        );
        let env = CniEnv {
            args: vec![("IP".into(), "10.0.0.x".into())],
            ..Default::default()
        };
        let err = requested_ips(&env, &c).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("CNI_ARGS"), "{err}");
    }
}
