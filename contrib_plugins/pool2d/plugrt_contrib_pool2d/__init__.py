"""plugrt-contrib-pool2d: more tactics for an op another plugin owns.

It provides no op. Through the ``plugrt_tactics`` hook it contributes a 2-D MaxPool kernel
(:mod:`plugrt_contrib_pool2d.max_pool`) to the default domain's ``MaxPool``, which the
built-in pooling plugin owns: the builder times it beside the owner's tactics and keeps
it where it is faster; plans record that it came from here.
"""

from plugrt import hookimpl

from plugrt_contrib_pool2d.max_pool import MaxPool2d

#: The plugrt plugin API versions this package is written for, inclusive.
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_tactics():
    return [MaxPool2d()]
