use crate::model::error::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("decoding: the prompt is empty; give at least one token")]
    EmptyPrompt,
    #[error("decoding: no prompt to decode; give at least one")]
    NoPrompts,
    #[error("decoding: the drafter does not fit the target: {what}")]
    Mismatch { what: String },
    #[error("decoding: sampling setting {what}")]
    BadSampling { what: String },
    #[error(
        "decoding: DDTree verification is greedy (the target's argmax followed down the tree); use temperature 0, or the chain method to sample"
    )]
    TreeNeedsGreedy,
    #[error("decoding: a tree budget of {budget} nodes drafts nothing; use ≥ 1")]
    BadBudget { budget: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
}
