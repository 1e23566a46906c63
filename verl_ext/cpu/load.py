"""The loader named in ``VERL_USE_EXTERNAL_MODULES``: ``import verl`` imports it in every process
(``verl/__init__.py:49-52``) and it installs the CPU adaptations, but only when ``VERL_PLATFORM=cpu``.

On any other host (a GPU cluster with the same environment variables copied around, a test process) the
import does nothing, so the ``cpu`` platform and ``hf_cpu`` rollout can never be picked up by accident.
"""

from verl_ext.cpu import cpu_platform_requested, register

if cpu_platform_requested():
    register()
