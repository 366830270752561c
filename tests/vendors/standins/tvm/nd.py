"""Stand-in for ``tvm.nd``: an array is a thin wrapper around a torch tensor."""

import torch.utils.dlpack


class NDArray:
    def __init__(self, tensor):
        self.tensor = tensor
        self.dtype = str(tensor.dtype).removeprefix("torch.")

    def to_dlpack(self):
        return torch.utils.dlpack.to_dlpack(self.tensor)

    def numpy(self):
        return self.tensor.numpy()


def from_dlpack(tensor):
    return NDArray(tensor)


def array(value):
    return NDArray(torch.as_tensor(value))
