//! What the in-training online evaluation (`online_eval.rs`) decodes; the daemon's setup
//! reads it from the run's prompt file and the trainer holds it.

/// The prompts an online evaluation decodes and the tokens that end a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlinePrompts {
    pub prompts: Vec<Vec<i64>>,
    pub stop_tokens: Vec<i64>,
}
