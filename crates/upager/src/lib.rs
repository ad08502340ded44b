//! upager engine (in progress)
