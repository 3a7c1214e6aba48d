"""Exporters that write HugeCTR model files (sparse folders, dense model, network JSON, ps.json)
from models trained elsewhere; today a PyTorch DLRM in facebookresearch/dlrm's style.

``export_dlrm`` is the entry point (``hps convert dlrm`` on the command line);
``write_dlrm_model`` is the writer underneath, also used to generate large synthetic models.
"""

from hps_core.export.dlrm_arch import DlrmArch, parse_dash_list
from hps_core.export.dlrm_export import export_dlrm
from hps_core.export.dlrm_files import (
    DlrmFiles,
    TableSource,
    checked_key_map,
    write_dlrm_model,
    write_embedding_table,
    write_ranking_files,
)
from hps_core.export.dlrm_network import (
    dlrm_network_json,
    embedding_layer_name,
    hugectr_dense_params,
    interaction_source_rows,
)
from hps_core.export.dlrm_state import (
    DlrmState,
    check_dlrm_state,
    infer_dlrm_arch,
    unwrap_checkpoint,
)
from hps_core.export.torch_source import load_checkpoint, module_state

__all__ = [
    "DlrmArch",
    "DlrmFiles",
    "DlrmState",
    "TableSource",
    "check_dlrm_state",
    "checked_key_map",
    "dlrm_network_json",
    "embedding_layer_name",
    "export_dlrm",
    "hugectr_dense_params",
    "infer_dlrm_arch",
    "interaction_source_rows",
    "load_checkpoint",
    "module_state",
    "parse_dash_list",
    "unwrap_checkpoint",
    "write_dlrm_model",
    "write_embedding_table",
    "write_ranking_files",
]
