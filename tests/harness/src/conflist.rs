//! Configuration lists, run the way libcni runs them.

use serde_json::{Value, json};

use crate::cni::{CniCall, CniOutput, find_plugin};

/// Which plugin of a list failed, and how.
#[derive(Debug)]
pub struct ChainError {
    pub plugin: String,
    pub output: CniOutput,
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} failed ({:?}): {} {}",
            self.plugin, self.output.code, self.output.stdout, self.output.stderr
        )
    }
}

impl std::error::Error for ChainError {}

/// The CNI versions a list runner here understands, oldest first.
const LIST_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn version_rank(version: &str) -> Option<usize> {
    LIST_VERSIONS.iter().position(|v| *v == version)
}

/// A network configuration list, run the way libcni runs one: each plugin's
/// configuration gets the list's `name` and `cniVersion`, a `runtimeConfig`
/// with the runtime's values for the capabilities it declares, and a
/// `prevResult` (ADD: the previous plugin's result; CHECK and DEL: the
/// list's ADD result); DEL runs the plugins in reverse order; CHECK is
/// skipped before 0.4.0 and with `disableCheck`, GC and STATUS before 1.1.0.
pub struct Conflist {
    pub list: Value,
}

impl Conflist {
    pub fn new(list: Value) -> Self {
        Conflist { list }
    }

    /// `cniVersions` (1.1.0): the newest one understood; else `cniVersion`.
    pub fn version(&self) -> String {
        if let Some(versions) = self.list["cniVersions"].as_array() {
            let best = versions
                .iter()
                .filter_map(Value::as_str)
                .filter_map(version_rank)
                .max();
            if let Some(best) = best {
                return LIST_VERSIONS[best].to_string();
            }
        }
        self.list["cniVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn plugins(&self) -> Vec<Value> {
        self.list["plugins"].as_array().cloned().unwrap_or_default()
    }

    /// What a runtime hands the first plugin of the list, without runtime
    /// values or a previous result: a network's own configuration.
    pub fn first_plugin_conf(&self) -> Value {
        self.plugin_conf(&self.list["plugins"][0], &json!({}), None)
    }

    /// One plugin's stdin.
    pub fn plugin_conf(
        &self,
        plugin: &Value,
        runtime_config: &Value,
        prev_result: Option<&Value>,
    ) -> Value {
        let mut conf = plugin.clone();
        conf["name"] = self.list["name"].clone();
        conf["cniVersion"] = json!(self.version());
        let mut rc = serde_json::Map::new();
        if let Some(caps) = plugin["capabilities"].as_object() {
            for (cap, on) in caps {
                if on.as_bool() == Some(true)
                    && let Some(value) = runtime_config.get(cap)
                {
                    rc.insert(cap.clone(), value.clone());
                }
            }
        }
        if !rc.is_empty() {
            conf["runtimeConfig"] = Value::Object(rc);
        }
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    fn run_plugin(
        &self,
        call: &CniCall,
        command: &str,
        conf: &Value,
    ) -> Result<CniOutput, ChainError> {
        let kind = conf["type"].as_str().unwrap_or_default().to_string();
        let mut call = call.clone();
        call.command = command.into();
        let out = call.run(&find_plugin(&kind, &call.path), conf.to_string().as_bytes());
        if out.success() {
            Ok(out)
        } else {
            Err(ChainError {
                plugin: kind,
                output: out,
            })
        }
    }

    /// ADD through the whole list; the last plugin's result.
    pub fn add(&self, call: &CniCall, runtime_config: &Value) -> Result<Value, ChainError> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, prev.as_ref());
            let out = self.run_plugin(call, "ADD", &conf)?;
            prev = Some(out.json());
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK through the whole list against the ADD `result`.
    pub fn check(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: &Value,
    ) -> Result<(), ChainError> {
        let disabled =
            self.list["disableCheck"] == json!(true) || self.list["disableCheck"] == json!("true");
        if disabled || version_rank(&self.version()) < version_rank("0.4.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, Some(result));
            self.run_plugin(call, "CHECK", &conf)?;
        }
        Ok(())
    }

    /// CHECK through the whole list, going on past the failures `known`
    /// accepts (a reference plugin's own bug); returns those.
    pub fn check_tolerating(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: &Value,
        known: impl Fn(&ChainError) -> bool,
    ) -> Result<Vec<ChainError>, ChainError> {
        let mut tolerated = Vec::new();
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, Some(result));
            match self.run_plugin(call, "CHECK", &conf) {
                Ok(_) => {}
                Err(e) if known(&e) => tolerated.push(e),
                Err(e) => return Err(e),
            }
        }
        Ok(tolerated)
    }

    /// DEL through the list in reverse order (with the ADD result if known).
    pub fn del(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: Option<&Value>,
    ) -> Result<(), ChainError> {
        for plugin in self.plugins().iter().rev() {
            let conf = self.plugin_conf(plugin, runtime_config, result);
            self.run_plugin(call, "DEL", &conf)?;
        }
        Ok(())
    }

    /// GC of every plugin with the still valid (containerID, ifname) pairs.
    pub fn gc(&self, call: &CniCall, valid: &[(&str, &str)]) -> Result<(), ChainError> {
        if version_rank(&self.version()) < version_rank("1.1.0") {
            return Ok(());
        }
        let attachments: Vec<Value> = valid
            .iter()
            .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
            .collect();
        for plugin in self.plugins() {
            let mut conf = self.plugin_conf(&plugin, &json!({}), None);
            conf["cni.dev/valid-attachments"] = json!(attachments);
            self.run_plugin(call, "GC", &conf)?;
        }
        Ok(())
    }

    /// STATUS of every plugin, in order.
    pub fn status(&self, call: &CniCall) -> Result<(), ChainError> {
        if version_rank(&self.version()) < version_rank("1.1.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, &json!({}), None);
            self.run_plugin(call, "STATUS", &conf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_get_the_list_name_newest_version_and_declared_runtime_values() {
        let list = Conflist::new(json!({
            "cniVersions": ["0.4.0", "1.1.0", "9.9.9"],
            "cniVersion": "0.3.1",
            "name": "net",
            "plugins": [
                {"type": "flatnet", "capabilities": {"mtu": true, "ips": false}},
                {"type": "portmap"},
            ],
        }));
        assert_eq!(list.version(), "1.1.0");
        assert_eq!(
            list.first_plugin_conf(),
            json!({"type": "flatnet", "capabilities": {"mtu": true, "ips": false},
                "name": "net", "cniVersion": "1.1.0"})
        );
        let conf = list.plugin_conf(
            &list.list["plugins"][0],
            &json!({"mtu": 1400, "ips": ["10.0.0.2/24"]}),
            Some(&json!({"cniVersion": "1.1.0"})),
        );
        assert_eq!(conf["runtimeConfig"], json!({"mtu": 1400}));
        assert_eq!(conf["prevResult"], json!({"cniVersion": "1.1.0"}));
        let old = Conflist::new(json!({"cniVersion": "0.3.1", "name": "n", "plugins": []}));
        assert_eq!(old.version(), "0.3.1");
    }
}
