//! The DNS server around a resolver: hickory's UDP and TCP serving
//! (framing, truncation to the client's buffer with the TC bit), a
//! [`Resolve`]r's answers, EDNS, the query log. Two resolvers serve
//! through it: the cluster's, which reads the newest [`ClusterSnapshot`]
//! from a channel (so the Kubernetes watches and the tests feed it alike),
//! and the CoreDNS mode's [`HostsResolver`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::{DNSClass, Name, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;

use crate::error::ServerError;
use crate::hosts::HostsResolver;
use crate::resolver::Answer;
use crate::snapshot::ClusterSnapshot;

/// The newest snapshot; replaced whole on every change.
pub type SnapshotReceiver = watch::Receiver<Arc<ClusterSnapshot>>;

/// What the server asks for each question it lets through (one question,
/// a standard query, EDNS version 0 at most).
pub trait Resolve: Send + Sync + 'static {
    /// The answer to `qname` (as the client wrote it) / `qtype` / `qclass`.
    fn answer(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer;

    /// Whether the query of `qname` is logged (CoreDNS's `log` plugin);
    /// the cluster's resolver logs none.
    fn logs(&self, _qname: &Name) -> bool {
        false
    }
}

/// The cluster's answers, from the newest snapshot.
impl Resolve for SnapshotReceiver {
    fn answer(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer {
        // Clone the Arc out: the channel's read lock is not held while
        // answering.
        let snapshot = Arc::clone(&self.borrow());
        snapshot.answer(qname, qtype, qclass)
    }
}

/// The CoreDNS mode's answers.
impl Resolve for HostsResolver {
    fn answer(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer {
        HostsResolver::answer(self, qname, qtype, qclass)
    }

    fn logs(&self, qname: &Name) -> bool {
        HostsResolver::logs(self, qname)
    }
}

/// The largest UDP payload offered to EDNS clients: the DNS Flag Day 2020
/// size, which avoids IP fragmentation; larger answers go over TCP.
const MAX_UDP_PAYLOAD: u16 = 1232;
/// A TCP connection with no query for this long is closed.
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses queued per TCP connection.
const TCP_RESPONSE_BUFFER: usize = 32;
/// Attempts at one free port for both UDP and TCP when asked for port 0.
const EPHEMERAL_PORT_ATTEMPTS: usize = 16;

/// hickory's request handler: one question in, [`Resolve::answer`] out.
pub struct DnsHandler {
    resolver: Box<dyn Resolve>,
}

impl DnsHandler {
    pub fn new(resolver: impl Resolve) -> Self {
        DnsHandler {
            resolver: Box::new(resolver),
        }
    }
}

/// CoreDNS's name of a response code, for the query log.
fn rcode_name(response_code: ResponseCode) -> String {
    match response_code {
        ResponseCode::NoError => "NOERROR".to_string(),
        ResponseCode::FormErr => "FORMERR".to_string(),
        ResponseCode::ServFail => "SERVFAIL".to_string(),
        ResponseCode::NXDomain => "NXDOMAIN".to_string(),
        ResponseCode::NotImp => "NOTIMP".to_string(),
        ResponseCode::Refused => "REFUSED".to_string(),
        other => u16::from(other).to_string(),
    }
}

/// One line of the query log, in the shape of CoreDNS's `log` plugin:
/// `{remote} - {id} "{type} {class} {name} {proto} {size} {do} {bufsize}"
/// {rcode} {flags} {duration}` (no response size); `sent` is the header
/// sent (with TC when truncated).
fn log_query(
    request: &Request,
    (qname, qtype, qclass): (&Name, RecordType, DNSClass),
    sent: &Metadata,
    started: Instant,
) {
    let (dnssec_ok, bufsize) = match &request.edns {
        Some(edns) => (edns.flags().dnssec_ok, edns.max_payload()),
        None => (false, 512),
    };
    let flags: Vec<&str> = [
        ("qr", sent.message_type == MessageType::Response),
        ("aa", sent.authoritative),
        ("tc", sent.truncation),
        ("rd", sent.recursion_desired),
        ("ra", sent.recursion_available),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect();
    tracing::info!(
        "{} - {} \"{qtype} {qclass} {qname} {} {} {dnssec_ok} {bufsize}\" {} {} {:.6}s",
        request.src(),
        request.metadata.id,
        request.protocol(),
        request.as_slice().len(),
        rcode_name(sent.response_code),
        flags.join(","),
        started.elapsed().as_secs_f64(),
    );
}

/// A response with no records and `response_code`.
async fn send_error(
    request: &Request,
    response_code: ResponseCode,
    response_edns: Option<&Edns>,
    response_handle: impl ResponseHandler,
) -> ResponseInfo {
    // Extended codes (BADVERS) keep their high bits in the OPT record.
    let mut extended;
    let mut edns = response_edns;
    if response_code.high() != 0
        && let Some(base) = response_edns
    {
        extended = base.clone();
        extended.set_rcode_high(response_code.high());
        edns = Some(&extended);
    }
    let response = MessageResponseBuilder::new(&request.queries, edns)
        .error_msg(&request.metadata, response_code);
    send(request, response_handle, response).await
}

async fn send<'a>(
    request: &Request,
    mut response_handle: impl ResponseHandler,
    response: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a hickory_server::proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_server::proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_server::proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_server::proto::rr::Record> + Send + 'a,
    >,
) -> ResponseInfo {
    match response_handle.send_response(response).await {
        Ok(info) => info,
        Err(error) => {
            tracing::warn!(%error, src = %request.src(), "cannot send a DNS response");
            let mut metadata = Metadata::response_from_request(&request.metadata);
            metadata.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata,
                counts: HeaderCounts::default(),
            })
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for DnsHandler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        // EDNS (RFC 6891): version 0 only; the client's buffer, within limits.
        let response_edns = request.edns.as_ref().map(|client| {
            let mut edns = Edns::new();
            edns.set_max_payload(client.max_payload().clamp(512, MAX_UDP_PAYLOAD));
            edns.set_version(0);
            edns
        });
        if request
            .edns
            .as_ref()
            .is_some_and(|client| client.version() > 0)
        {
            return send_error(
                request,
                ResponseCode::BADVERS,
                response_edns.as_ref(),
                response_handle,
            )
            .await;
        }
        if request.metadata.message_type != MessageType::Query {
            return send_error(
                request,
                ResponseCode::FormErr,
                response_edns.as_ref(),
                response_handle,
            )
            .await;
        }
        if request.metadata.op_code != OpCode::Query {
            return send_error(
                request,
                ResponseCode::NotImp,
                response_edns.as_ref(),
                response_handle,
            )
            .await;
        }
        // Exactly one question.
        let Ok(info) = request.request_info() else {
            return send_error(
                request,
                ResponseCode::FormErr,
                response_edns.as_ref(),
                response_handle,
            )
            .await;
        };
        let started = Instant::now();
        let query = info.query;
        let qname = query.original().name();
        let answer = self
            .resolver
            .answer(qname, query.query_type(), query.query_class());
        tracing::debug!(
            name = %query.name(),
            qtype = %query.query_type(),
            response_code = %answer.response_code,
            answers = answer.answers.len(),
            "answered"
        );
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = answer.authoritative;
        metadata.response_code = answer.response_code;
        // Not a recursive server: it answers for its zones only.
        metadata.recursion_available = false;
        let response = MessageResponseBuilder::new(&request.queries, response_edns.as_ref()).build(
            metadata,
            answer.answers.iter(),
            answer.authorities.iter(),
            std::iter::empty(),
            answer.additionals.iter(),
        );
        let info = send(request, response_handle, response).await;
        if self.resolver.logs(qname) {
            let question = (qname, query.query_type(), query.query_class());
            log_query(request, question, &info, started);
        }
        info
    }
}

/// The DNS server, bound on UDP and TCP at one address.
pub struct DnsServer {
    server: Server<DnsHandler>,
    local_addr: SocketAddr,
}

impl DnsServer {
    /// Binds UDP and TCP at `listen`; with port 0, at one free port for
    /// both. Serving `resolver`'s answers starts at once.
    pub async fn bind(listen: SocketAddr, resolver: impl Resolve) -> Result<Self, ServerError> {
        let (udp, tcp) = bind_both(listen).await?;
        let local_addr = udp.local_addr().map_err(ServerError::LocalAddr)?;
        let mut server = Server::new(DnsHandler::new(resolver));
        server.register_socket(udp);
        server.register_listener(tcp, TCP_IDLE_TIMEOUT, TCP_RESPONSE_BUFFER);
        Ok(DnsServer { server, local_addr })
    }

    /// Where it listens (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until a socket fails; it never stops by itself otherwise.
    pub async fn run(mut self) -> Result<(), ServerError> {
        self.server
            .block_until_done()
            .await
            .map_err(ServerError::Serve)?;
        Err(ServerError::Stopped)
    }
}

async fn bind_both(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), ServerError> {
    let bind_error = |protocol, addr, source| ServerError::Bind {
        protocol,
        addr,
        source,
    };
    let mut attempt = 1;
    loop {
        let udp = UdpSocket::bind(listen)
            .await
            .map_err(|e| bind_error("UDP", listen, e))?;
        let udp_addr = udp.local_addr().map_err(ServerError::LocalAddr)?;
        match TcpListener::bind(udp_addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // The kernel's free UDP port may be taken for TCP: try another.
            Err(_) if listen.port() == 0 && attempt < EPHEMERAL_PORT_ATTEMPTS => attempt += 1,
            Err(error) => return Err(bind_error("TCP", udp_addr, error)),
        }
    }
}
