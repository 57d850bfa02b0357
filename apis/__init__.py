"""fgpu wire contract: names, generated protobuf/gRPC code and the protocol library shared by all components."""
