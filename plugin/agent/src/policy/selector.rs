//! Label selectors (`metav1.LabelSelector`) as the API server defines them.

use std::collections::BTreeMap;

use super::network_policy::{Requirement, Selector};

/// Whether `selector` selects an object with `labels`: every matchLabels
/// pair and every matchExpressions requirement holds. The empty selector
/// selects everything. A requirement the API server would reject (an
/// unknown operator, In/NotIn without values) selects nothing, as upstream
/// refuses to turn it into a selector at all: failing closed here means a
/// policy peer allows nothing rather than everything.
pub fn matches(selector: &Selector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector.match_labels.iter().flatten();
    let expressions = selector.match_expressions.iter().flatten();
    pairs
        .into_iter()
        .all(|(key, value)| labels.get(key) == Some(value))
        && expressions
            .into_iter()
            .all(|r| requirement_holds(r, labels))
}

fn requirement_holds(requirement: &Requirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|v| values.contains(v)),
        "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selector of a policy whose podSelector is `json`.
    fn selector(json: serde_json::Value) -> Selector {
        let policy: crate::policy::NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "x", "name": "p"},
            "spec": {"podSelector": json}
        }))
        .unwrap();
        Selector::clone(&policy.spec.unwrap().pod_selector.unwrap())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_empty_selector_selects_everything() {
        let empty = selector(serde_json::json!({}));
        assert!(matches(&empty, &labels(&[])));
        assert!(matches(&empty, &labels(&[("app", "web")])));
        let empty_lists = selector(serde_json::json!({"matchLabels": {}, "matchExpressions": []}));
        assert!(matches(&empty_lists, &labels(&[])));
    }

    #[test]
    fn match_labels_need_every_pair() {
        let s = selector(serde_json::json!({"matchLabels": {"app": "web", "tier": "front"}}));
        assert!(matches(
            &s,
            &labels(&[("app", "web"), ("tier", "front"), ("x", "y")])
        ));
        assert!(!matches(&s, &labels(&[("app", "web")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("tier", "back")])));
    }

    #[test]
    fn each_operator_as_upstream() {
        let cases = [
            (
                "In",
                Some(vec!["a", "b"]),
                vec![(Some("a"), true), (Some("c"), false), (None, false)],
            ),
            (
                "NotIn",
                Some(vec!["a", "b"]),
                vec![(Some("a"), false), (Some("c"), true), (None, true)],
            ),
            (
                "Exists",
                None,
                vec![(Some("a"), true), (Some(""), true), (None, false)],
            ),
            ("DoesNotExist", None, vec![(Some("a"), false), (None, true)]),
            // Rejected by the API server: select nothing.
            ("In", Some(vec![]), vec![(Some("a"), false), (None, false)]),
            ("NotIn", None, vec![(Some("a"), false), (None, false)]),
            (
                "Equals",
                Some(vec!["a"]),
                vec![(Some("a"), false), (None, false)],
            ),
        ];
        for (operator, values, expectations) in cases {
            let s = selector(serde_json::json!({"matchExpressions": [
                {"key": "k", "operator": operator, "values": values}
            ]}));
            for (value, expected) in expectations {
                let l = value.map_or_else(|| labels(&[("other", "x")]), |v| labels(&[("k", v)]));
                assert_eq!(
                    matches(&s, &l),
                    expected,
                    "{operator} {values:?} on {value:?}"
                );
            }
        }
    }

    #[test]
    fn labels_and_expressions_are_anded() {
        let s = selector(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }));
        assert!(matches(&s, &labels(&[("app", "web"), ("env", "dev")])));
        assert!(matches(&s, &labels(&[("app", "web")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("env", "prod")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("canary", "1")])));
        assert!(!matches(&s, &labels(&[("env", "dev")])));
    }
}
