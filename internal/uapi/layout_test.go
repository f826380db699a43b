package uapi

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/testenv"
)

// layouts maps every Go mirror type to the C struct it mirrors.
var layouts = []struct {
	c string
	v any
}{
	{"ib_uverbs_cmd_hdr", CmdHdr{}},
	{"ib_uverbs_ex_cmd_hdr", ExCmdHdr{}},
	{"ib_uverbs_ioctl_hdr", IoctlHdr{}},
	{"ib_uverbs_attr", Attr{}},
	{"ib_uverbs_get_context", GetContext{}},
	{"ib_uverbs_get_context_resp", GetContextResp{}},
	{"ib_uverbs_query_device", QueryDevice{}},
	{"ib_uverbs_query_device_resp", QueryDeviceResp{}},
	{"ib_uverbs_ex_query_device", ExQueryDevice{}},
	{"ib_uverbs_ex_query_device_resp", ExQueryDeviceResp{}},
	{"ib_uverbs_query_port", QueryPort{}},
	{"ib_uverbs_query_port_resp", QueryPortResp{}},
	{"ib_uverbs_alloc_pd", AllocPD{}},
	{"ib_uverbs_alloc_pd_resp", AllocPDResp{}},
	{"ib_uverbs_dealloc_pd", DeallocPD{}},
	{"ib_uverbs_reg_mr", RegMR{}},
	{"ib_uverbs_reg_mr_resp", RegMRResp{}},
	{"ib_uverbs_dereg_mr", DeregMR{}},
	{"ib_uverbs_create_comp_channel", CreateCompChannel{}},
	{"ib_uverbs_create_comp_channel_resp", CreateCompChannelResp{}},
	{"ib_uverbs_create_cq", CreateCQ{}},
	{"ib_uverbs_create_cq_resp", CreateCQResp{}},
	{"ib_uverbs_destroy_cq", DestroyCQ{}},
	{"ib_uverbs_destroy_cq_resp", DestroyCQResp{}},
	{"ib_uverbs_req_notify_cq", ReqNotifyCQ{}},
	{"ib_uverbs_create_qp", CreateQP{}},
	{"ib_uverbs_create_qp_resp", CreateQPResp{}},
	{"ib_uverbs_qp_dest", QPDest{}},
	{"ib_uverbs_modify_qp", ModifyQP{}},
	{"ib_uverbs_query_qp", QueryQP{}},
	{"ib_uverbs_query_qp_resp", QueryQPResp{}},
	{"ib_uverbs_destroy_qp", DestroyQP{}},
	{"ib_uverbs_destroy_qp_resp", DestroyQPResp{}},
	{"ib_uverbs_post_send", PostSend{}},
	{"ib_uverbs_post_send_resp", PostSendResp{}},
	{"ib_uverbs_wc", WC{}},
	{"ib_uverbs_async_event_desc", AsyncEventDesc{}},
	{"ib_uverbs_comp_event_desc", CompEventDesc{}},
	{"ib_uverbs_gid_entry", GIDEntry{}},
	{"ib_uverbs_ah_attr", AHAttr{}},
	{"ib_uverbs_create_ah", CreateAH{}},
	{"ib_uverbs_create_ah_resp", CreateAHResp{}},
	{"ib_uverbs_destroy_ah", DestroyAH{}},
	{"rxe_create_ah_resp", RxeCreateAHResp{}},
	{"mminfo", RxeMmapInfo{}},
	{"rxe_create_cq_resp", RxeCreateCQResp{}},
	{"rxe_create_qp_resp", RxeCreateQPResp{}},
	{"rxe_queue_buf", RxeQueueBuf{}},
	{"rxe_sge", RxeSGE{}},
	{"rxe_dma_info", RxeDMAInfo{}},
	{"rxe_send_wr", RxeSendWR{}},
	{"rxe_send_wqe", RxeSendWQE{}},
	{"rxe_recv_wqe", RxeRecvWQE{}},
}

// extra are C expressions whose value the Go side relies on without a
// one-to-one Go field (union arms, flexible arrays, constants).
var extra = map[string]uint64{
	"offsetof(struct rxe_send_wr, wr.rdma.remote_addr)": 24,
	"offsetof(struct rxe_send_wr, wr.rdma.rkey)":        32,
	"offsetof(struct rxe_send_wr, ex.invalidate_rkey)":  20,
	"offsetof(struct rxe_send_wr, wr.ud.remote_qpn)":    24,
	"offsetof(struct rxe_send_wr, wr.ud.remote_qkey)":   28,
	"offsetof(struct rxe_send_wr, wr.ud.pkey_index)":    32,
	"offsetof(struct rxe_send_wr, wr.ud.ah_num)":        36,
	"IB_USER_VERBS_CMD_CREATE_AH":                       CmdCreateAH,
	"IB_USER_VERBS_CMD_DESTROY_AH":                      CmdDestroyAH,
	"offsetof(struct rxe_send_wqe, dma.sge)":            208,
	"offsetof(struct rxe_send_wqe, dma.inline_data)":    208,
	"offsetof(struct rxe_recv_wqe, dma.sge)":            40,
	"offsetof(struct rxe_queue_buf, data)":              RxeQueueHeaderSize,
	"sizeof(struct ib_uverbs_send_wr)":                  SendWRSize,
	"RDMA_VERBS_IOCTL":                                  RDMAVerbsIoctl,
	"UVERBS_ATTR_UHW_IN":                                AttrUHWIn,
	"UVERBS_ATTR_UHW_OUT":                               AttrUHWOut,
	"UVERBS_ATTR_F_MANDATORY":                           AttrFMandatory,
	"UVERBS_ATTR_F_VALID_OUTPUT":                        AttrFValidOutput,
	"RDMA_DRIVER_RXE":                                   DriverRXE,
	"RDMA_DRIVER_MLX5":                                  DriverMLX5,
	"IB_USER_VERBS_CMD_POST_SEND":                       CmdPostSend,
	"IB_USER_VERBS_CMD_MODIFY_QP":                       CmdModifyQP,
	"IB_USER_VERBS_CMD_CREATE_QP":                       CmdCreateQP,
	"IB_USER_VERBS_CMD_CREATE_CQ":                       CmdCreateCQ,
	"IB_USER_VERBS_CMD_REQ_NOTIFY_CQ":                   CmdReqNotifyCQ,
	"IB_USER_VERBS_CMD_FLAG_EXTENDED":                   CmdFlagExtended,
	"IB_USER_VERBS_EX_CMD_QUERY_DEVICE":                 CmdExQueryDevice &^ CmdFlagExtended,
	"UVERBS_OBJECT_CQ":                                  ObjectCQ,
	"UVERBS_OBJECT_QP":                                  ObjectQP,
	"UVERBS_OBJECT_ASYNC_EVENT":                         ObjectAsyncEvent,
	"UVERBS_METHOD_QUERY_GID_TABLE":                     MethodQueryGIDTable,
	"UVERBS_METHOD_CQ_CREATE":                           MethodCQCreate,
	"UVERBS_METHOD_CQ_DESTROY":                          MethodCQDestroy,
	"UVERBS_METHOD_QP_DESTROY":                          MethodQPDestroy,
	"UVERBS_METHOD_ASYNC_EVENT_ALLOC":                   MethodAsyncEventAlloc,
	"UVERBS_ATTR_CREATE_CQ_RESP_CQE":                    AttrCreateCQRespCQE,
	"UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL":                AttrCreateCQCompChannel,
	"UVERBS_ATTR_CREATE_CQ_EVENT_FD":                    AttrCreateCQEventFD,
	"UVERBS_ATTR_DESTROY_CQ_RESP":                       AttrDestroyCQResp,
	"UVERBS_ATTR_DESTROY_QP_RESP":                       AttrDestroyQPResp,
	"UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES":      AttrQueryGIDTableRespNumEntries,
	"IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD":                 WRAtomicFetchAndAdd,
	"IB_UVERBS_WR_SEND_WITH_INV":                        WRSendWithInv,
	"IB_UVERBS_WC_FETCH_ADD":                            WCFetchAdd,
	"IB_UVERBS_GID_TYPE_ROCE_V2":                        GIDTypeRoCEv2,
	"IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN":                 2,
}

type field struct {
	cpath     string
	off, size uint64
}

func goFields(t reflect.Type) []field {
	var fs []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("c")
		if f.Name == "_" || tag == "-" {
			continue
		}
		if tag == "" {
			panic(fmt.Sprintf("%s.%s has no c tag", t.Name(), f.Name))
		}
		fs = append(fs, field{tag, uint64(f.Offset), uint64(f.Type.Size())})
	}
	return fs
}

// TestLayoutsMatchKernelHeaders compiles a C program against the installed
// UAPI headers and compares sizeof/offsetof of every mirrored struct and field.
func TestLayoutsMatchKernelHeaders(t *testing.T) {
	gcc := testenv.GCC(t, "gcc linux-libc-dev", "/usr/include/rdma/ib_user_verbs.h")
	var src bytes.Buffer
	src.WriteString(`#include <stdio.h>
#include <stddef.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <rdma/rdma_user_rxe.h>
#define FSZ(s, f) sizeof(((struct s *)0)->f)
int main(void) {
`)
	var want []string // "key value" lines in the same order as printed
	for _, l := range layouts {
		typ := reflect.TypeOf(l.v)
		fmt.Fprintf(&src, "\tprintf(\"%%s|%%zu\\n\", \"sizeof %s\", sizeof(struct %s));\n", l.c, l.c)
		want = append(want, fmt.Sprintf("sizeof %s|%d", l.c, typ.Size()))
		for _, f := range goFields(typ) {
			fmt.Fprintf(&src, "\tprintf(\"%%s|%%zu %%zu\\n\", \"%s.%s\", offsetof(struct %s, %s), FSZ(%s, %s));\n",
				l.c, f.cpath, l.c, f.cpath, l.c, f.cpath)
			want = append(want, fmt.Sprintf("%s.%s|%d %d", l.c, f.cpath, f.off, f.size))
		}
	}
	for expr, v := range extra {
		fmt.Fprintf(&src, "\tprintf(\"%%s|%%llu\\n\", %q, (unsigned long long)(%s));\n", expr, expr)
		want = append(want, fmt.Sprintf("%s|%d", expr, v))
	}
	src.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	cfile := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(cfile, src.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O0", "-Wall", "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run layout checker: %v", err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), "|")
		got[key] = val
	}
	checked := 0
	for _, w := range want {
		key, val, _ := strings.Cut(w, "|")
		if g, ok := got[key]; !ok {
			t.Errorf("%s: not printed by the C checker", key)
		} else if g != val {
			t.Errorf("%s: Go has %s, C headers have %s", key, val, g)
		}
		checked++
	}
	t.Logf("checked %d sizes/offsets/constants against /usr/include/rdma", checked)
}

// TestHostLayout checks every mirror struct starts with structs.HostLayout and
// uses only fixed-size kinds.
func TestHostLayout(t *testing.T) {
	for _, l := range layouts {
		typ := reflect.TypeOf(l.v)
		if typ.Field(0).Name != "_" || typ.Field(0).Type.String() != "structs.HostLayout" {
			t.Errorf("%s: first field is not structs.HostLayout", typ.Name())
		}
		checkKinds(t, typ)
	}
}

func checkKinds(t *testing.T, typ reflect.Type) {
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		switch f.Type.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Int32, reflect.Int64:
		case reflect.Array:
			switch f.Type.Elem().Kind() {
			case reflect.Uint8, reflect.Uint32:
			default:
				t.Errorf("%s.%s: forbidden array element %s", typ.Name(), f.Name, f.Type.Elem())
			}
		case reflect.Struct:
			if f.Name != "_" {
				checkKinds(t, f.Type)
			}
		default:
			t.Errorf("%s.%s: forbidden kind %s", typ.Name(), f.Name, f.Type.Kind())
		}
	}
}
