//! The DFlash training step and everything around it.
