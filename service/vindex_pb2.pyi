from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateCollectionRequest(_message.Message):
    __slots__ = ("name", "dim", "metric", "config_json", "if_not_exists", "id_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    IF_NOT_EXISTS_FIELD_NUMBER: _ClassVar[int]
    ID_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    metric: str
    config_json: str
    if_not_exists: bool
    id_type: str
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., metric: _Optional[str] = ..., config_json: _Optional[str] = ..., if_not_exists: _Optional[bool] = ..., id_type: _Optional[str] = ...) -> None: ...

class CollectionInfo(_message.Message):
    __slots__ = ("name", "dim", "metric", "count", "config_json", "id_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ID_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    metric: str
    count: int
    config_json: str
    id_type: str
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., metric: _Optional[str] = ..., count: _Optional[int] = ..., config_json: _Optional[str] = ..., id_type: _Optional[str] = ...) -> None: ...

class DropCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropCollectionResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: bool
    def __init__(self, dropped: _Optional[bool] = ...) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[CollectionInfo]
    def __init__(self, collections: _Optional[_Iterable[_Union[CollectionInfo, _Mapping]]] = ...) -> None: ...

class DescribeCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UpsertRequest(_message.Message):
    __slots__ = ("collection", "ids", "vectors", "dim", "add_only", "float_vectors", "str_ids", "metadata", "no_metadata", "documents", "no_document", "metadata_arrow")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    ADD_ONLY_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VECTORS_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NO_METADATA_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NO_DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_ARROW_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    vectors: bytes
    dim: int
    add_only: bool
    float_vectors: _containers.RepeatedScalarFieldContainer[float]
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    no_metadata: _containers.RepeatedScalarFieldContainer[bool]
    documents: _containers.RepeatedScalarFieldContainer[str]
    no_document: _containers.RepeatedScalarFieldContainer[bool]
    metadata_arrow: bytes
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., vectors: _Optional[bytes] = ..., dim: _Optional[int] = ..., add_only: _Optional[bool] = ..., float_vectors: _Optional[_Iterable[float]] = ..., str_ids: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., no_metadata: _Optional[_Iterable[bool]] = ..., documents: _Optional[_Iterable[str]] = ..., no_document: _Optional[_Iterable[bool]] = ..., metadata_arrow: _Optional[bytes] = ...) -> None: ...

class UpsertResponse(_message.Message):
    __slots__ = ("upserted",)
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    upserted: int
    def __init__(self, upserted: _Optional[int] = ...) -> None: ...

class UpsertAck(_message.Message):
    __slots__ = ("chunk", "upserted", "total")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    upserted: int
    total: int
    def __init__(self, chunk: _Optional[int] = ..., upserted: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("collection", "ids", "str_ids", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    filter: _struct_pb2.Struct
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., str_ids: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("collection", "ids", "str_ids", "include")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    include: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., str_ids: _Optional[_Iterable[str]] = ..., include: _Optional[_Iterable[str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("vectors", "dim", "found", "metadata", "no_metadata", "documents", "no_document")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NO_METADATA_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NO_DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    vectors: bytes
    dim: int
    found: _containers.RepeatedScalarFieldContainer[bool]
    metadata: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    no_metadata: _containers.RepeatedScalarFieldContainer[bool]
    documents: _containers.RepeatedScalarFieldContainer[str]
    no_document: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, vectors: _Optional[bytes] = ..., dim: _Optional[int] = ..., found: _Optional[_Iterable[bool]] = ..., metadata: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., no_metadata: _Optional[_Iterable[bool]] = ..., documents: _Optional[_Iterable[str]] = ..., no_document: _Optional[_Iterable[bool]] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("collection", "queries", "dim", "k", "max_postings", "eps", "ef", "float_queries", "nq", "filter", "include", "threads", "recall_target")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    MAX_POSTINGS_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    EF_FIELD_NUMBER: _ClassVar[int]
    FLOAT_QUERIES_FIELD_NUMBER: _ClassVar[int]
    NQ_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    RECALL_TARGET_FIELD_NUMBER: _ClassVar[int]
    collection: str
    queries: bytes
    dim: int
    k: int
    max_postings: int
    eps: float
    ef: int
    float_queries: _containers.RepeatedScalarFieldContainer[float]
    nq: int
    filter: _struct_pb2.Struct
    include: _containers.RepeatedScalarFieldContainer[str]
    threads: int
    recall_target: float
    def __init__(self, collection: _Optional[str] = ..., queries: _Optional[bytes] = ..., dim: _Optional[int] = ..., k: _Optional[int] = ..., max_postings: _Optional[int] = ..., eps: _Optional[float] = ..., ef: _Optional[int] = ..., float_queries: _Optional[_Iterable[float]] = ..., nq: _Optional[int] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., include: _Optional[_Iterable[str]] = ..., threads: _Optional[int] = ..., recall_target: _Optional[float] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("nq", "k", "ids", "distances", "postings", "records_scanned", "partial", "postings_dropped", "id_type", "str_ids", "metadata", "no_metadata", "documents", "no_document", "vectors", "dim")
    NQ_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DISTANCES_FIELD_NUMBER: _ClassVar[int]
    POSTINGS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    POSTINGS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ID_TYPE_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NO_METADATA_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NO_DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    nq: int
    k: int
    ids: _containers.RepeatedScalarFieldContainer[int]
    distances: _containers.RepeatedScalarFieldContainer[float]
    postings: int
    records_scanned: int
    partial: bool
    postings_dropped: int
    id_type: str
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    no_metadata: _containers.RepeatedScalarFieldContainer[bool]
    documents: _containers.RepeatedScalarFieldContainer[str]
    no_document: _containers.RepeatedScalarFieldContainer[bool]
    vectors: bytes
    dim: int
    def __init__(self, nq: _Optional[int] = ..., k: _Optional[int] = ..., ids: _Optional[_Iterable[int]] = ..., distances: _Optional[_Iterable[float]] = ..., postings: _Optional[int] = ..., records_scanned: _Optional[int] = ..., partial: _Optional[bool] = ..., postings_dropped: _Optional[int] = ..., id_type: _Optional[str] = ..., str_ids: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., no_metadata: _Optional[_Iterable[bool]] = ..., documents: _Optional[_Iterable[str]] = ..., no_document: _Optional[_Iterable[bool]] = ..., vectors: _Optional[bytes] = ..., dim: _Optional[int] = ...) -> None: ...

class CountRequest(_message.Message):
    __slots__ = ("collection", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    filter: _struct_pb2.Struct
    def __init__(self, collection: _Optional[str] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CountResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class ScrollRequest(_message.Message):
    __slots__ = ("collection", "filter", "batch", "include", "page_token")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    collection: str
    filter: _struct_pb2.Struct
    batch: int
    include: _containers.RepeatedScalarFieldContainer[str]
    page_token: str
    def __init__(self, collection: _Optional[str] = ..., filter: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., batch: _Optional[int] = ..., include: _Optional[_Iterable[str]] = ..., page_token: _Optional[str] = ...) -> None: ...

class ScrollResponse(_message.Message):
    __slots__ = ("id_type", "ids", "str_ids", "metadata", "no_metadata", "documents", "no_document", "vectors", "dim", "next_page_token")
    ID_TYPE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NO_METADATA_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NO_DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id_type: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    no_metadata: _containers.RepeatedScalarFieldContainer[bool]
    documents: _containers.RepeatedScalarFieldContainer[str]
    no_document: _containers.RepeatedScalarFieldContainer[bool]
    vectors: bytes
    dim: int
    next_page_token: str
    def __init__(self, id_type: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., str_ids: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., no_metadata: _Optional[_Iterable[bool]] = ..., documents: _Optional[_Iterable[str]] = ..., no_document: _Optional[_Iterable[bool]] = ..., vectors: _Optional[bytes] = ..., dim: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetMetadataRequest(_message.Message):
    __slots__ = ("collection", "ids", "str_ids", "metadata", "replace")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    STR_IDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    str_ids: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    replace: bool
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., str_ids: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., replace: _Optional[bool] = ...) -> None: ...

class SetMetadataResponse(_message.Message):
    __slots__ = ("updated",)
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    updated: int
    def __init__(self, updated: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    def __init__(self, collection: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("stats_json",)
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    stats_json: str
    def __init__(self, stats_json: _Optional[str] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("collection", "wait_idle")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    WAIT_IDLE_FIELD_NUMBER: _ClassVar[int]
    collection: str
    wait_idle: bool
    def __init__(self, collection: _Optional[str] = ..., wait_idle: _Optional[bool] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("idle",)
    IDLE_FIELD_NUMBER: _ClassVar[int]
    idle: bool
    def __init__(self, idle: _Optional[bool] = ...) -> None: ...
