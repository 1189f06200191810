//! One handler per CNI verb. What they share about a network's life on the
//! node is in `flatnet_datapath::node`.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod host_ports;
pub mod plan;
pub mod status;
/// `open` for CNI_NETNS, with the error a runtime should see.
pub fn open_cni_netns(path: &std::path::Path) -> flatnet_cni::error::Result<std::fs::File> {
    use flatnet_datapath::netns::{self, NetnsProblem};
    netns::open(path).map_err(|problem| {
        let reason = match problem {
            NetnsProblem::Missing => format!("{} does not exist", path.display()),
            NetnsProblem::NotANamespace => {
                format!("{} is not a namespace file (nsfs)", path.display())
            }
            NetnsProblem::NotNetwork => format!(
                "{} is a namespace but not a network namespace",
                path.display()
            ),
            NetnsProblem::Unreadable(e) => format!("{} cannot be opened: {e}", path.display()),
        };
        flatnet_cni::error::Error::invalid_env("CNI_NETNS", reason)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn cni_netns_errors_name_the_variable() {
        let err = super::open_cni_netns(std::path::Path::new("/nonexistent")).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("CNI_NETNS"));
    }
}
