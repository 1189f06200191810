//! The reference model: NetworkPolicy semantics on the stub's objects,
//! written from the API's definitions, not from the agent's code.

use super::*;

pub(super) fn labels_of(object: &Value) -> &Value {
    &object["metadata"]["labels"]
}

/// A label selector (matchLabels and matchExpressions); `{}` selects all.
pub(super) fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |key: &str| labels.get(key).and_then(Value::as_str);
    let labels_ok = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(key, value)| label(key) == value.as_str());
    let expressions_ok = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().expect("key");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().expect("operator") {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => !label(key).is_some_and(|v| values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                other => panic!("operator {other}"),
            }
        });
    labels_ok && expressions_ok
}

/// A pod as the model sees it: the stub's object and its namespace's.
pub(super) struct Subject<'a> {
    pod: &'a Value,
    namespace: &'a Value,
}

impl Subject<'_> {
    fn ns(&self) -> &str {
        self.pod["metadata"]["namespace"].as_str().unwrap()
    }

    fn ip(&self) -> Ipv4Addr {
        self.pod["status"]["podIP"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The container port named `name` for `proto`.
    fn named_port(&self, name: &str, proto: Proto) -> Option<u16> {
        self.pod["spec"]["containers"]
            .as_array()?
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| {
                p["name"].as_str() == Some(name)
                    && p["protocol"].as_str().unwrap_or("TCP") == proto.api()
            })
            .and_then(|p| p["containerPort"].as_u64())
            .map(|p| p as u16)
    }
}

/// Whether `peer` (one entry of `from` or `to`) of a policy in
/// `policy_ns` matches `other`.
pub(super) fn peer_matches(peer: &Value, policy_ns: &str, other: &Subject) -> bool {
    if let Some(block) = peer.get("ipBlock") {
        let cidr: Ipv4Network = block["cidr"].as_str().unwrap().parse().unwrap();
        let excepted = block["except"].as_array().into_iter().flatten().any(|e| {
            let e: Ipv4Network = e.as_str().unwrap().parse().unwrap();
            e.contains(other.ip())
        });
        return cidr.contains(other.ip()) && !excepted;
    }
    let namespace_ok = match peer.get("namespaceSelector") {
        Some(selector) => selects(selector, labels_of(other.namespace)),
        None => other.ns() == policy_ns,
    };
    let pod_ok = match peer.get("podSelector") {
        Some(selector) => selects(selector, labels_of(other.pod)),
        None => true,
    };
    namespace_ok && pod_ok
}

/// Whether a rule's `ports` let `port`/`proto` of `dst` through.
pub(super) fn ports_match(ports: &Value, dst: &Subject, port: u16, proto: Proto) -> bool {
    let Some(ports) = ports.as_array().filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|entry| {
        if entry["protocol"].as_str().unwrap_or("TCP") != proto.api() {
            return false;
        }
        match &entry["port"] {
            Value::Null => true,
            Value::Number(n) => {
                let first = n.as_u64().unwrap() as u16;
                let last = entry["endPort"].as_u64().map_or(first, |p| p as u16);
                (first..=last).contains(&port)
            }
            Value::String(name) => dst.named_port(name, proto) == Some(port),
            other => panic!("port {other}"),
        }
    })
}

/// Whether `policy` isolates its pods for ingress / egress.
pub(super) fn policy_types(policy: &Value) -> (bool, bool) {
    match policy["spec"]["policyTypes"].as_array() {
        Some(types) => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        None => (true, policy["spec"].get("egress").is_some()),
    }
}

/// Whether the policies let `subject` (ingress: the destination; egress:
/// the source) talk with `peer`, the connection going to `dst`'s port.
pub(super) fn direction_allows(
    policies: &[Value],
    ingress: bool,
    subject: &Subject,
    peer: &Subject,
    dst: &Subject,
    port: u16,
    proto: Proto,
) -> bool {
    let (rules_key, peers_key) = if ingress {
        ("ingress", "from")
    } else {
        ("egress", "to")
    };
    let selecting: Vec<&Value> = policies
        .iter()
        .filter(|p| {
            p["metadata"]["namespace"].as_str() == Some(subject.ns())
                && selects(&p["spec"]["podSelector"], labels_of(subject.pod))
                && {
                    let (i, e) = policy_types(p);
                    if ingress { i } else { e }
                }
        })
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|policy| {
        let policy_ns = policy["metadata"]["namespace"].as_str().unwrap();
        policy["spec"][rules_key]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let peers_ok = match rule[peers_key].as_array().filter(|p| !p.is_empty()) {
                    None => true,
                    Some(peers) => peers.iter().any(|p| peer_matches(p, policy_ns, peer)),
                };
                peers_ok && ports_match(&rule["ports"], dst, port, proto)
            })
    })
}

/// The expected 9x9 table of `port`/`proto` for the stub's objects now.
pub(super) fn model(stub: &ApiStub, ids: &[String], port: u16, proto: Proto) -> Table<bool> {
    let policies = stub.list(Kind::NetworkPolicy);
    let pods: Vec<Value> = ids
        .iter()
        .map(|id| stub.get(Kind::Pod, id).expect("pod in the stub"))
        .collect();
    let namespaces: Vec<Value> = pods
        .iter()
        .map(|p| {
            stub.get(
                Kind::Namespace,
                p["metadata"]["namespace"].as_str().unwrap(),
            )
            .expect("namespace in the stub")
        })
        .collect();
    let subjects: Vec<Subject> = pods
        .iter()
        .zip(&namespaces)
        .map(|(pod, namespace)| Subject { pod, namespace })
        .collect();
    subjects
        .iter()
        .enumerate()
        .map(|(i, src)| {
            subjects
                .iter()
                .enumerate()
                .map(|(j, dst)| {
                    // Loopback: never seen by any datapath.
                    i == j
                        || (direction_allows(&policies, false, src, dst, dst, port, proto)
                            && direction_allows(&policies, true, dst, src, dst, port, proto))
                })
                .collect()
        })
        .collect()
}
