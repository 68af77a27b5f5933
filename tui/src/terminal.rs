//! The real terminal: raw mode and the alternate screen on the way in, restored on the way out,
//! on panic (ratatui's hook) and when the process is told to stop.
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{self, Event, KeyEventKind};
use dflash_shared::clock::now_ms;
use ratatui::DefaultTerminal;
use tokio::sync::mpsc;

use crate::app::AppEvent;

/// Enters the console screen. Refuses when stdout is not a terminal, naming the headless
/// alternatives.
pub fn enter() -> anyhow::Result<DefaultTerminal> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "this needs an interactive terminal; without one use `dflash-tui tail --follow` or \
             `dflash-tui status`"
        );
    }
    // try_init installs a panic hook that restores the terminal before the panic is printed.
    Ok(ratatui::try_init()?)
}

pub fn leave() {
    ratatui::restore();
}

/// Reads keys and resizes on a plain thread (crossterm's reader blocks) until dropped.
pub struct InputThread {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl InputThread {
    pub fn spawn(events: mpsc::Sender<AppEvent>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("dflash-tui-input".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match event::poll(Duration::from_millis(100)) {
                        Ok(false) => continue,
                        Ok(true) => {}
                        Err(_) => break,
                    }
                    let forwarded = match event::read() {
                        Ok(Event::Key(key)) if key.kind != KeyEventKind::Release => {
                            events.blocking_send(AppEvent::Key(key))
                        }
                        Ok(Event::Resize(_, _)) => events.blocking_send(AppEvent::Resize),
                        Ok(_) => Ok(()),
                        Err(_) => break,
                    };
                    if forwarded.is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the input thread");
        Self {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for InputThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Sends the wall clock to the console every second, so ages and countdowns move.
pub fn spawn_ticker(events: mpsc::Sender<AppEvent>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if events.send(AppEvent::Tick(now_ms())).await.is_err() {
                return;
            }
        }
    })
}

/// Turns SIGTERM and SIGHUP into a clean quit, so the terminal is restored either way.
pub fn spawn_signal_watcher(events: mpsc::Sender<AppEvent>) -> tokio::task::JoinHandle<()> {
    use tokio::signal::unix::{signal, SignalKind};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        let _ = events.send(AppEvent::Shutdown).await;
    })
}
