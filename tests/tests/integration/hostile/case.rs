//! A hostile case: what is changed from a valid ADD, the error code and
//! message it must get, and the judgement of its outcome.

use flatnet_tests::*;
use serde_json::{Value, json};

/// One hostile invocation.
pub(super) struct Case {
    pub(super) name: String,
    pub(super) plugin: &'static str,
    /// Variables to change from the valid ADD environment: None unsets.
    pub(super) env: Vec<(&'static str, Option<String>)>,
    pub(super) stdin: Vec<u8>,
    pub(super) code: u64,
    pub(super) needle: String,
}

pub(super) fn case(
    name: &str,
    env: Vec<(&'static str, Option<String>)>,
    stdin: Vec<u8>,
    code: u64,
    needle: &str,
) -> Case {
    Case {
        name: name.into(),
        plugin: "flatnet",
        env,
        stdin,
        code,
        needle: needle.into(),
    }
}

pub(super) fn set(var: &'static str, value: &str) -> (&'static str, Option<String>) {
    (var, Some(value.to_string()))
}

pub(super) fn unset(var: &'static str) -> (&'static str, Option<String>) {
    (var, None)
}

pub(super) fn with(conf: &Value, key: &str, value: Value) -> Vec<u8> {
    let mut conf = conf.clone();
    conf[key] = value;
    conf.to_string().into_bytes()
}

/// `conf` at CNI 1.1.0, the version STATUS and GC need.
pub(super) fn at_1_1_0(conf: &Value) -> Value {
    let mut v1_1 = conf.clone();
    v1_1["cniVersion"] = json!("1.1.0");
    v1_1
}

/// Why `out` is not the answer `case` needs, if it is not.
pub(super) fn check_outcome(case: &Case, out: &CniOutput) -> Option<String> {
    if out.code != Some(1) {
        return Some(format!(
            "exit status {:?}, not 1 (a panic is 101, a signal None)",
            out.code
        ));
    }
    if out.stderr.contains("panicked") {
        return Some("panicked".into());
    }
    let Ok(object) = serde_json::from_str::<Value>(out.stdout.trim()) else {
        return Some(format!(
            "stdout is not one JSON error object: {:?}",
            out.stdout
        ));
    };
    if object["code"] != case.code {
        return Some(format!("code {} instead of {}", object["code"], case.code));
    }
    let msg = object["msg"].as_str().unwrap_or_default();
    if !msg.contains(&case.needle) {
        return Some(format!("message {msg:?} does not name {:?}", case.needle));
    }
    if object["cniVersion"].as_str().is_none_or(str::is_empty) {
        return Some("the error object has no cniVersion".into());
    }
    if out.stderr.trim().is_empty() {
        return Some("no human line on stderr".into());
    }
    None
}
