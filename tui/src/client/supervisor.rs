//! The console's link to the daemon: connects, subscribes, backfills the journal, polls status,
//! forwards requests, and reconnects with backoff whenever the daemon goes away.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dflash_shared::protocol::{Access, Request, Response, Topic};
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::session::{Push, Session, Welcome, ACTION_TIMEOUT, MAX_EVENT_PAGES, REQUEST_TIMEOUT};

/// What the link tells the console.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    Connecting {
        attempt: u32,
    },
    Connected(Welcome),
    /// A pushed frame, or a reply to the link's own queries (status, journal backfill).
    Frame(Response),
    /// A frame that could not be read; the link goes on.
    Garbled(String),
    Lost {
        reason: String,
        retry_in: Duration,
    },
    /// The reply to a request the console asked the link to send.
    Reply {
        request: Request,
        result: Result<Response, String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum LinkCommand {
    Send(Request),
}

#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub socket: PathBuf,
    pub topics: Vec<Topic>,
    pub status_every: Duration,
    pub backoff: Backoff,
    /// The hello's access: `attach --read-only` says read-only, and the daemon holds it to that.
    pub access: Access,
}

impl LinkConfig {
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            topics: vec![Topic::Metrics, Topic::Events, Topic::Logs],
            status_every: Duration::from_secs(1),
            backoff: Backoff::default(),
            access: Access::Full,
        }
    }
}

enum Ended {
    /// The console went away; stop for good.
    Stop,
    Lost(String),
}

/// Runs until the console drops its command sender or its event receiver.
pub async fn run_link<E>(
    mut config: LinkConfig,
    events: mpsc::Sender<E>,
    mut commands: mpsc::Receiver<LinkCommand>,
) where
    E: From<LinkEvent> + Send + 'static,
{
    let mut last_seq: Option<u64> = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        if events
            .send(LinkEvent::Connecting { attempt }.into())
            .await
            .is_err()
        {
            return;
        }
        let reason = match Session::connect_with(&config.socket, config.access).await {
            Ok((session, welcome, mut pushes)) => {
                config.backoff.reset();
                attempt = 0;
                if events
                    .send(LinkEvent::Connected(welcome).into())
                    .await
                    .is_err()
                {
                    return;
                }
                let session = Arc::new(session);
                let link = Served {
                    session: &session,
                    events: &events,
                    status_every: config.status_every,
                };
                match link
                    .serve(&config.topics, &mut pushes, &mut commands, &mut last_seq)
                    .await
                {
                    Ended::Stop => return,
                    Ended::Lost(reason) => reason,
                }
            }
            Err(e) => e.to_string(),
        };
        let retry_in = config.backoff.next_delay();
        if events
            .send(LinkEvent::Lost { reason, retry_in }.into())
            .await
            .is_err()
        {
            return;
        }
        if !wait_answering_offline(retry_in, &events, &mut commands).await {
            return;
        }
    }
}

/// Sleeps for `delay`; requests made meanwhile fail at once instead of hanging.
async fn wait_answering_offline<E: From<LinkEvent>>(
    delay: Duration,
    events: &mpsc::Sender<E>,
    commands: &mut mpsc::Receiver<LinkCommand>,
) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            command = commands.recv() => match command {
                None => return false,
                Some(LinkCommand::Send(request)) => {
                    let reply = LinkEvent::Reply {
                        request,
                        result: Err("not connected to dflashd; retrying".into()),
                    };
                    if events.send(reply.into()).await.is_err() {
                        return false;
                    }
                }
            },
        }
    }
}

struct Served<'a, E> {
    session: &'a Arc<Session>,
    events: &'a mpsc::Sender<E>,
    status_every: Duration,
}

impl<E: From<LinkEvent> + Send + 'static> Served<'_, E> {
    async fn emit(&self, event: LinkEvent) -> Result<(), Ended> {
        self.events
            .send(event.into())
            .await
            .map_err(|_| Ended::Stop)
    }

    async fn serve(
        &self,
        topics: &[Topic],
        pushes: &mut mpsc::Receiver<Push>,
        commands: &mut mpsc::Receiver<LinkCommand>,
        last_seq: &mut Option<u64>,
    ) -> Ended {
        match self.serve_inner(topics, pushes, commands, last_seq).await {
            Ok(never) => match never {},
            Err(ended) => ended,
        }
    }

    /// Status polls and the console's requests run as their own tasks: the daemon answers a
    /// confirmed stop only once the run has checkpointed, and the link must keep reading
    /// meanwhile. A poll is skipped while the previous one is unanswered.
    fn spawn_status_poll(&self, in_flight: &Arc<AtomicBool>) {
        if in_flight.swap(true, Ordering::SeqCst) {
            return;
        }
        let (session, events, in_flight) = (
            Arc::clone(self.session),
            self.events.clone(),
            Arc::clone(in_flight),
        );
        tokio::spawn(async move {
            let event = match session.request(&Request::Status).await {
                Ok(frame) => LinkEvent::Frame(frame),
                Err(e) => LinkEvent::Garbled(format!("status: {e}")),
            };
            in_flight.store(false, Ordering::SeqCst);
            let _ = events.send(event.into()).await;
        });
    }

    fn spawn_request(&self, request: Request) {
        let (session, events) = (Arc::clone(self.session), self.events.clone());
        tokio::spawn(async move {
            let timeout = match request {
                Request::Confirm { .. } => ACTION_TIMEOUT,
                _ => REQUEST_TIMEOUT,
            };
            let result = session
                .request_with_timeout(&request, timeout)
                .await
                .map_err(|e| e.to_string());
            let _ = events
                .send(LinkEvent::Reply { request, result }.into())
                .await;
        });
    }

    async fn serve_inner(
        &self,
        topics: &[Topic],
        pushes: &mut mpsc::Receiver<Push>,
        commands: &mut mpsc::Receiver<LinkCommand>,
        last_seq: &mut Option<u64>,
    ) -> Result<std::convert::Infallible, Ended> {
        let subscribe = Request::Subscribe {
            topics: topics.to_vec(),
        };
        if let Err(e) = self.session.request(&subscribe).await {
            return Err(Ended::Lost(format!("subscribe failed: {e}")));
        }
        match self.session.events_after(*last_seq, MAX_EVENT_PAGES).await {
            Ok(events) => {
                let frame = Response::Events { events };
                note_seq(&frame, last_seq);
                self.emit(LinkEvent::Frame(frame)).await?;
            }
            Err(crate::client::ClientError::Closed) => {
                return Err(Ended::Lost("connection closed".into()))
            }
            Err(e) => {
                self.emit(LinkEvent::Garbled(format!("journal backfill: {e}")))
                    .await?
            }
        }
        let status_in_flight = Arc::new(AtomicBool::new(false));
        let mut status_tick = tokio::time::interval(self.status_every);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                push = pushes.recv() => match push {
                    None => return Err(Ended::Lost("connection closed".into())),
                    Some(Push::Closed(reason)) => return Err(Ended::Lost(reason)),
                    Some(Push::Garbled(e)) => self.emit(LinkEvent::Garbled(e.to_string())).await?,
                    Some(Push::Frame(frame)) => {
                        note_seq(&frame, last_seq);
                        self.emit(LinkEvent::Frame(frame)).await?;
                    }
                },
                _ = status_tick.tick() => self.spawn_status_poll(&status_in_flight),
                command = commands.recv() => match command {
                    None => return Err(Ended::Stop),
                    Some(LinkCommand::Send(request)) => self.spawn_request(request),
                },
            }
        }
    }
}

fn note_seq(frame: &Response, last_seq: &mut Option<u64>) {
    let newest = match frame {
        Response::Event(event) => Some(event.seq),
        Response::Events { events } => events.iter().map(|e| e.seq).max(),
        _ => None,
    };
    if let Some(seq) = newest {
        *last_seq = Some(last_seq.map_or(seq, |s| s.max(seq)));
    }
}
