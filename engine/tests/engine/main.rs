//! The engine's integration tests: one binary, so libtorch is linked once. Each module is one
//! subject; `support` holds the fixtures they share (`drafter`: tiny drafter configs and random
//! inputs; `topology`: trainers on the embedded tiny target, on chosen CPU topologies).
mod support;

mod data_chat;
mod data_fixture_tokenizer;
mod data_pretokenized;
mod decode_chain;
mod decode_dflash2;
mod decode_domino;
mod decode_dspark;
mod decode_tree;
mod domino_first_step;
mod drafter_attention;
mod drafter_checkpointing;
mod drafter_config;
mod drafter_model;
mod drafter_reference;
mod embedded_chat;
mod embedded_target;
mod eval_placement;
mod fixed_shapes;
mod learning;
mod online_eval_domino;
mod resume_unlocked;
mod resume_verdicts;
mod target_decode_parity;
mod throughput;
mod topology_equivalence;
mod topology_failure;
mod topology_queue;
mod topology_resume;
mod training_loop;
mod tree_oracle;
mod warm_start;
