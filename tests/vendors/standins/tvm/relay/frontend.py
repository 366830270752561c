"""Stand-in for ``tvm.relay.frontend``."""


class IRModule:
    def __init__(self, script_module, input_names):
        self.script_module = script_module
        self.input_names = input_names


def from_pytorch(script_module, shape_list):
    return IRModule(script_module, [name for name, _ in shape_list]), {}
