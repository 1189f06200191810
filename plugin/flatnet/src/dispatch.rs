//! The `flatnet` plugin's dispatch: parses flatnet's configuration, checks
//! the verb against its version, and runs the verb's handler.

use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::runner::{Output, Plugin, Report};
use flatnet_cni::{runtime, version};

use crate::after_answer::AfterAnswer;
use crate::config::NetConf;
use crate::error::{Error, Result};
use crate::verbs;

/// The `flatnet` plugin.
pub const FLATNET: Plugin = Plugin {
    name: "flatnet",
    log_tag: "",
    dispatch: |command, env, stdin, report| Ok(dispatch(command, env, stdin, report)?),
};

/// The `flatnet` binary run by a runtime (CNI_COMMAND set).
pub fn run_cni() -> std::process::ExitCode {
    flatnet_cni::runner::run(&FLATNET)
}

fn dispatch(command: Command, env: &CniEnv, stdin: &[u8], report: &mut Report) -> Result<Output> {
    let mut conf = NetConf::parse(stdin)?;
    report.cni_version = conf.version.as_str().to_string();
    report.log_file = conf.log_file.clone();
    conf.version.require_verb(command)?;
    match command {
        // Only ADD and CHECK act on CNI_ARGS (DEL skips what it cannot read:
        // it must always be able to clean up).
        Command::Add | Command::Check => {
            runtime::check_cni_args(&env.args, runtime::FLATNET_CNI_ARGS)?;
            if conf.mac.is_none() {
                conf.mac = runtime::cni_args_mac(&env.args)?;
            }
        }
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))?;
    let mut after = AfterAnswer::default();
    let outcome: Result<Output> = runtime.block_on(async {
        match command {
            Command::Add => {
                // Later in a chain, the result keeps what the earlier
                // plugins reported (see verbs::plan).
                let result = verbs::add::add(env, &conf, stdin, &mut after).await?;
                Ok(Output::Json(result.to_version(conf.version)))
            }
            Command::Del => verbs::del::del(env, &conf, stdin, &mut after)
                .await
                .map(|()| Output::Nothing),
            Command::Check => verbs::check::check(env, &conf, stdin)
                .await
                .map(|()| Output::Nothing),
            Command::Status => verbs::status::status(env, &conf, stdin)
                .await
                .map(|()| Output::Nothing)
                .map_err(Error::from),
            Command::Gc => verbs::gc::gc(env, &conf, stdin, &mut after)
                .await
                .map(|()| Output::Nothing),
            // The runner answers VERSION before the configuration is read.
            Command::Version => Ok(Output::Json(
                serde_json::to_value(version::version_info(stdin)?).unwrap_or_default(),
            )),
        }
    });
    // The verb's runtime is gone: the work after the answer may fork.
    drop(runtime);
    if !after.is_empty() {
        report.after_answer = Some(Box::new(move || after.run_detached()));
    }
    outcome
}
