//! An attachment made through a configuration list, taken back on drop.

use std::process::Command;

use serde_json::Value;

use crate::{ChainError, CniCall, Conflist, link_exists};

/// An attachment made through a configuration list, taken back on drop
/// even when the test panicked: DEL through the list (as libcni runs it
/// after a failed ADD too), then any host device a chained plugin named in
/// the result and left (the bandwidth plugin's ifb device).
pub struct ListAttachment<'a> {
    list: &'a Conflist,
    pub call: CniCall,
    pub runtime_config: Value,
    /// The list's result; Null until ADD succeeded.
    pub result: Value,
    deleted: bool,
}

impl<'a> ListAttachment<'a> {
    /// ADD through `list`; the guard is armed before ADD runs.
    pub fn add(
        list: &'a Conflist,
        call: CniCall,
        runtime_config: Value,
    ) -> Result<Self, ChainError> {
        let mut attachment = ListAttachment {
            list,
            call,
            runtime_config,
            result: Value::Null,
            deleted: false,
        };
        attachment.result = list.add(&attachment.call, &attachment.runtime_config)?;
        Ok(attachment)
    }

    /// Host devices of the result that are not the pod's, nor flatnet's
    /// host veth: what a chained plugin made (the bandwidth plugin's ifb).
    pub fn chained_devices(&self) -> Vec<String> {
        let flatnet_veth = self.result["interfaces"][0]["name"].as_str();
        self.result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i.get("sandbox").is_none())
            .filter_map(|i| i["name"].as_str())
            .filter(|name| Some(*name) != flatnet_veth)
            .map(str::to_string)
            .collect()
    }

    /// DEL through the list in reverse order; the guard is then disarmed.
    pub fn del(&mut self) -> Result<(), ChainError> {
        let result = (!self.result.is_null()).then_some(&self.result);
        self.list.del(&self.call, &self.runtime_config, result)?;
        self.deleted = true;
        Ok(())
    }
}

impl Drop for ListAttachment<'_> {
    fn drop(&mut self) {
        if !self.deleted
            && let Err(e) = self.del()
        {
            eprintln!("cleanup DEL of {}: {e}", self.call.container_id);
        }
        for device in self.chained_devices() {
            if link_exists(&device) {
                let _ = Command::new("ip").args(["link", "del", &device]).output();
            }
        }
    }
}
