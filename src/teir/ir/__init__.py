"""The TEIR records, their enums, and their JSON form."""

from teir.ir.enums import DataType, DimType, ExecType, PrimFirst, PrimLast, PrimMain, Tensor
from teir.ir.files import load, load_all, save
from teir.ir.records import Config, Primitives, Rest, Schedule

__all__ = [
    "Config",
    "DataType",
    "DimType",
    "ExecType",
    "PrimFirst",
    "PrimLast",
    "PrimMain",
    "Primitives",
    "Rest",
    "Schedule",
    "Tensor",
    "load",
    "load_all",
    "save",
]
