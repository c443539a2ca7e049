"""Training-loop tools: the double-buffered pipeline, minibatch selection, averaging and asynchronous schemes."""
