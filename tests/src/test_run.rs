//! The datapath's programs run on crafted frames with `BPF_PROG_TEST_RUN`:
//! the kernel builds an skb (tc) or an XDP buffer around the bytes given,
//! runs the program once and hands back its return value and the frame as
//! the program left it. Nothing is sent anywhere: a redirect is only a
//! return value here.
//!
//! The programs run against a datapath loaded for the test alone, pinned
//! under a directory of its own on /sys/fs/bpf (`ScratchDatapath`).

use std::path::{Path, PathBuf};

use aya::programs::tc::SchedClassifier;
use aya::programs::{TestRun, TestRunOptions, Xdp};
use aya_obj::programs::XdpAttachType;
use flatnet::config::DatapathMode;
use flatnet_datapath::bpf::{Datapath, ensure_bpffs_at};

/// tc verdicts (linux/pkt_cls.h). flatnet hands frames on with "next"
/// (`TC_ACT_UNSPEC`, -1; `TCX_NEXT`), so later programs and the legacy
/// qdisc still run; the test run reports it as an unsigned value.
pub const TC_NEXT: u32 = u32::MAX;
pub const TC_ACT_SHOT: u32 = 2;
/// What `bpf_redirect` and `bpf_redirect_peer` return; under test_run the
/// redirect itself never happens.
pub const TC_ACT_REDIRECT: u32 = 7;

/// XDP verdicts (enum xdp_action).
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// `sizeof(struct __sk_buff)` (linux/bpf.h, Linux 6.x).
const SK_BUFF_LEN: usize = 192;
/// Offset of `__sk_buff.ifindex`: test_run takes the skb's device from it,
/// and the program reads it back as `skb->ifindex`. Every other field it
/// accepts (mark, priority, cb, tstamp, ...) stays zero here; the ones it
/// does not accept (pkt_type, tc_classid, ...) must be zero or it refuses
/// the run.
const SK_BUFF_IFINDEX: usize = 40;
/// Offset of `__sk_buff.mark`, which test_run takes in and hands back.
const SK_BUFF_MARK: usize = 8;

/// `sizeof(struct xdp_md)`: data, data_end, data_meta, ingress_ifindex,
/// rx_queue_index, egress_ifindex, all u32.
const XDP_MD_LEN: usize = 24;
const XDP_MD_DATA: usize = 0;
const XDP_MD_DATA_END: usize = 4;
const XDP_MD_INGRESS_IFINDEX: usize = 12;

/// Room for the frame the program hands back: the datapath never grows a
/// frame, the margin only turns a growth into a visible length change
/// instead of ENOSPC.
const OUTPUT_MARGIN: usize = 256;

/// What a program did with one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The program's return value (`TC_ACT_*` or `XDP_*`).
    pub verdict: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// `value` written in native byte order at `offset` of a context struct.
fn put_u32(context: &mut [u8], offset: usize, value: u32) {
    context[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
}

/// Runs the pinned tc program at `program` once on `frame`, as if it had
/// arrived on the device `ifindex` (which must exist in the calling
/// thread's network namespace: run this inside `Netns::run`). test_run
/// refuses (EINVAL) a frame shorter than an Ethernet header, and one whose
/// ethertype is IPv4 or IPv6 without a whole IP header.
pub fn run_tc(program: &Path, frame: &[u8], ifindex: u32) -> anyhow::Result<Outcome> {
    Ok(run_tc_marked(program, frame, ifindex, 0)?.0)
}

/// `run_tc` on an skb carrying `mark` (`skb->mark`), with the mark the
/// program left.
pub fn run_tc_marked(
    program: &Path,
    frame: &[u8],
    ifindex: u32,
    mark: u32,
) -> anyhow::Result<(Outcome, u32)> {
    let classifier = SchedClassifier::from_pin(program)
        .map_err(|e| anyhow::Error::new(e).context(format!("opening {}", program.display())))?;
    let mut context = [0u8; SK_BUFF_LEN];
    put_u32(&mut context, SK_BUFF_IFINDEX, ifindex);
    put_u32(&mut context, SK_BUFF_MARK, mark);
    let mut context_out = [0u8; SK_BUFF_LEN];
    let mut output = vec![0u8; frame.len() + OUTPUT_MARGIN];
    let result = classifier
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut output),
            ctx_in: Some(&context),
            ctx_out: Some(&mut context_out),
            ..TestRunOptions::default()
        })
        .map_err(|e| anyhow::Error::new(e).context(format!("test run of {}", program.display())))?;
    output.truncate(result.data_size_out as usize);
    let mark_after = u32::from_ne_bytes(
        context_out[SK_BUFF_MARK..SK_BUFF_MARK + 4]
            .try_into()
            .expect("four bytes"),
    );
    Ok((
        Outcome {
            verdict: result.return_value,
            frame: output,
        },
        mark_after,
    ))
}

/// The average time one run of the pinned tc program at `program` takes on
/// `frame` (arrived on `ifindex`), over `repeat` runs the kernel times
/// itself (`BPF_PROG_TEST_RUN`'s duration), with the verdict they gave.
/// The frame is built once: a program that rewrites it meets its own
/// rewrite on the next run, which changes no decision of flatnet's.
pub fn time_tc(
    program: &Path,
    frame: &[u8],
    ifindex: u32,
    repeat: u32,
) -> anyhow::Result<(u32, std::time::Duration)> {
    let classifier = SchedClassifier::from_pin(program)
        .map_err(|e| anyhow::Error::new(e).context(format!("opening {}", program.display())))?;
    let mut context = [0u8; SK_BUFF_LEN];
    put_u32(&mut context, SK_BUFF_IFINDEX, ifindex);
    let result = classifier
        .test_run(TestRunOptions {
            data_in: Some(frame),
            ctx_in: Some(&context),
            repeat,
            ..TestRunOptions::default()
        })
        .map_err(|e| anyhow::Error::new(e).context(format!("test run of {}", program.display())))?;
    Ok((result.return_value, result.duration))
}

/// Runs the pinned XDP program at `program` once on `frame`, received on
/// `ingress_ifindex` (queue 0; a device of the calling thread's namespace).
/// test_run refuses (EINVAL) a frame shorter than an Ethernet header.
pub fn run_xdp(program: &Path, frame: &[u8], ingress_ifindex: u32) -> anyhow::Result<Outcome> {
    let xdp = Xdp::from_pin(program, XdpAttachType::Interface)
        .map_err(|e| anyhow::Error::new(e).context(format!("opening {}", program.display())))?;
    let mut context = [0u8; XDP_MD_LEN];
    // No metadata: the frame starts at 0 and data_end is its length.
    put_u32(&mut context, XDP_MD_DATA, 0);
    put_u32(&mut context, XDP_MD_DATA_END, u32::try_from(frame.len())?);
    put_u32(&mut context, XDP_MD_INGRESS_IFINDEX, ingress_ifindex);
    let mut output = vec![0u8; frame.len() + OUTPUT_MARGIN];
    let result = xdp
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut output),
            ctx_in: Some(&context),
            ..TestRunOptions::default()
        })
        .map_err(|e| anyhow::Error::new(e).context(format!("test run of {}", program.display())))?;
    output.truncate(result.data_size_out as usize);
    Ok(Outcome {
        verdict: result.return_value,
        frame: output,
    })
}

/// A datapath loaded for one test: its own pin root under /sys/fs/bpf and
/// its own network name, so its maps (endpoints, counters, TCP_FLOWS)
/// start empty and no other test or node sees them. Unpinned and removed
/// on drop, also when the test fails.
pub struct ScratchDatapath {
    pub datapath: Datapath,
    root: PathBuf,
}

impl ScratchDatapath {
    /// Loads `mode`'s programs under a fresh pin root.
    pub fn load(mode: DatapathMode) -> anyhow::Result<Self> {
        let root = PathBuf::from(format!(
            "/sys/fs/bpf/flatnet-progtest-{}",
            crate::unique("")
        ));
        // The guard exists before anything is created, so a failed load
        // leaves nothing behind either.
        let scratch = ScratchDatapath {
            datapath: Datapath::with_root(&root, &crate::unique("ptnet-")),
            root,
        };
        ensure_bpffs_at(&scratch.root).map_err(|e| anyhow::anyhow!("{e}"))?;
        scratch
            .datapath
            .load(mode)
            .map_err(|e| anyhow::anyhow!("loading the datapath: {e}"))?;
        Ok(scratch)
    }

    /// Where this build pinned `program`.
    pub fn program_path(&self, program: &str) -> PathBuf {
        self.datapath.program_path(program)
    }
}

impl Drop for ScratchDatapath {
    fn drop(&mut self) {
        if let Err(e) = self.datapath.remove_pins() {
            eprintln!("removing {}: {e}", self.datapath.pin_dir().display());
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}
